//! The DynamoDB `Store` adapter (issue 4; being built).
