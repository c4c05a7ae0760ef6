//! The daemons as a library: the primary serving its twin and clients, the
//! twin following a primary, and the typed client. Binaries parse
//! arguments and call these.
//!
//! By role, each folder opening with what it owns and what it may not
//! touch:
//!
//! - [`primary`]: the primary daemon (clients, its twin's session, a
//!   switchover's I/O, retention);
//! - [`twin`]: the twin daemon (following a primary, its retention);
//! - [`client`]: the typed client and the request/answer wire it speaks;
//! - [`transfer`]: a box's restore, the snapshot transfer, and serving a
//!   restore;
//! - [`store_host`]: the store beside a daemon's log;
//! - [`failover`]: the files and calls of a failover (epochs, the
//!   predecessor call, rejoin, the divergent tail); the rules themselves
//!   are the sans-IO machines in [`crate::repl`];
//! - [`arbiter`]: automatic failover's etcd (the lease, the leader key,
//!   the sync record, a twin's take-over).
//!
//! [`clock`] and [`verify`] serve both daemons. The old flat paths
//! (`node::api`, `node::restore`, ...) are re-exported below.

pub mod arbiter;
pub mod client;
pub mod clock;
pub mod failover;
pub mod primary;
pub mod store_host;
pub mod transfer;
pub mod twin;
pub mod verify;

pub use client::{api, refusal, store_client};
pub use failover::{divergent, epoch, predecessor, rejoin};
pub use primary::retention;
pub use transfer::{restore, restore_serve, snapshot_transfer};
pub use twin::retention as twin_retention;

pub use api::{ApiError, Durability, Request, Response, Status};
pub use client::{
    Appended, Client, ClientError, ClientOptions, FollowOptions, Following, FrameHead, Locate,
    PrimaryAt, Tailing,
};
pub use primary::{Primary, PrimaryOptions, TwinPolicy};
pub use refusal::{ReadRefusal, WriteRefusal};
pub use twin::{Twin, TwinOptions, TwinStatus};
