//! One SDK client per region, built lazily from one `SdkConfig`: a request may search and
//! launch in several regions, while the Lambda's own region is just one of them.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use aws_config::SdkConfig;

/// A cache of clients by region name. Clients are cheap to clone (they share an `Arc`).
#[derive(Clone)]
pub struct Regional<C> {
    config: SdkConfig,
    build: fn(&SdkConfig, &str) -> C,
    clients: Arc<Mutex<HashMap<String, C>>>,
}

impl<C: Clone> Regional<C> {
    pub fn new(config: &SdkConfig, build: fn(&SdkConfig, &str) -> C) -> Regional<C> {
        Regional {
            config: config.clone(),
            build,
            clients: Arc::new(Mutex::new(HashMap::new())),
        }
    }

    /// The client for `region`, built on first use.
    pub fn get(&self, region: &str) -> C {
        let mut clients = self.clients.lock().unwrap_or_else(|p| p.into_inner());
        clients
            .entry(region.to_string())
            .or_insert_with(|| (self.build)(&self.config, region))
            .clone()
    }

    /// Uses `client` for `region` instead of building one (tests with mocked clients).
    pub fn insert(&self, region: &str, client: C) {
        let mut clients = self.clients.lock().unwrap_or_else(|p| p.into_inner());
        clients.insert(region.to_string(), client);
    }
}

impl<C> std::fmt::Debug for Regional<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let clients = self.clients.lock().unwrap_or_else(|p| p.into_inner());
        let mut regions: Vec<&String> = clients.keys().collect();
        regions.sort();
        f.debug_struct("Regional")
            .field("regions", &regions)
            .finish()
    }
}
