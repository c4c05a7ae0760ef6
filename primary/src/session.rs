//! The connections a command opens, each closed before the command exits:
//! a connection left open holds its place on the primary until QUIC's idle
//! timeout, and a script that runs a command per frame would pile them up.

use std::sync::{Arc, Mutex};

use twinlog::daemon::{self, DaemonError, PrimaryConfig};
use twinlog::node::{Client, ClientOptions};

use crate::args::{ConfigArg, TimeoutArg};

#[derive(Default)]
pub struct Connections(Mutex<Vec<Arc<Client>>>);

impl Connections {
    /// The admin client of the configured primary.
    pub async fn admin(
        &self,
        config: &ConfigArg,
        timeout: &TimeoutArg,
    ) -> Result<Arc<Client>, DaemonError> {
        self.admin_with(&config.load()?, timeout.options()).await
    }

    /// The admin client of `cfg`'s primary, waiting as `opts` say.
    pub async fn admin_with(
        &self,
        cfg: &PrimaryConfig,
        opts: ClientOptions,
    ) -> Result<Arc<Client>, DaemonError> {
        let client = Arc::new(daemon::load::admin_client_with(cfg, opts).await?);
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(client.clone());
        Ok(client)
    }

    /// Close every connection opened, whatever the command's outcome.
    pub async fn close(&self) {
        let open = std::mem::take(&mut *self.0.lock().unwrap_or_else(|e| e.into_inner()));
        for client in open {
            client.close().await;
        }
    }
}
