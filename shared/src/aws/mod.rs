//! Adapters: AWS SDK clients behind the ports. All SDK <-> domain conversion lives here.

pub mod dynamodb;
