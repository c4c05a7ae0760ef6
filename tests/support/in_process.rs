//! A primary served in this process on loopback, with a pinned client
//! identity, for the tests that talk to it over QUIC.

#![allow(dead_code)] // each test uses its own part

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::sync::watch;
use twinlog::log::Log;
use twinlog::net::{self, Identity, Pins, Role};
use twinlog::node::{Client, Primary, PrimaryOptions, TwinPolicy};

pub struct Running {
    pub primary: Arc<Primary>,
    pub addr: SocketAddr,
    pub server: Identity,
    pub client: Identity,
    /// Stops the primary when dropped.
    pub stop: watch::Sender<bool>,
}

impl Running {
    /// A client of this primary, connected, with the default options.
    pub async fn connect(&self) -> Client {
        Client::connect(&self.client, self.server.fingerprint(), self.addr)
            .await
            .expect("client")
    }
}

/// A primary on `dir` with no twin, under `cfg` (its policy `wait`).
pub fn start_exactly(dir: &std::path::Path, cfg: PrimaryOptions) -> Running {
    let cfg = PrimaryOptions {
        policy: TwinPolicy::Wait,
        ..cfg
    };
    start_pinned(dir, cfg, None)
}

/// A primary on `dir` with a twin pinned that never comes, under `cfg`:
/// its `twin` appends wait as its policy says.
pub fn start_with_absent_twin(dir: &std::path::Path, cfg: PrimaryOptions) -> Running {
    start_pinned(dir, cfg, Some(Identity::mint().expect("mint")))
}

fn start_pinned(dir: &std::path::Path, cfg: PrimaryOptions, twin: Option<Identity>) -> Running {
    let (server, client) = (
        Identity::mint().expect("mint"),
        Identity::mint().expect("mint"),
    );
    let log = Arc::new(Log::open(dir).expect("log"));
    let mut pins = Pins::new().pin(client.fingerprint(), Role::Client);
    if let Some(twin) = twin {
        pins = pins.pin(twin.fingerprint(), Role::Twin);
    }
    let pins = Arc::new(pins);
    let endpoint =
        net::server(([127, 0, 0, 1], 0).into(), &server, pins.clone()).expect("endpoint");
    let addr = endpoint.local_addr().expect("addr");
    let primary = Primary::new(log, pins, cfg);
    let (stop, stopped) = watch::channel(false);
    tokio::spawn(primary.clone().serve(endpoint, stopped));
    Running {
        primary,
        addr,
        server,
        client,
        stop,
    }
}
