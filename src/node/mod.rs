//! The daemons as a library: the primary serving its twin and clients, the
//! twin following a primary, and the typed client. Binaries parse
//! arguments and call these.

pub mod api;
pub mod client;
pub mod clock;
pub mod divergent;
pub mod epoch;
mod pipe;
pub mod predecessor;
pub mod primary;
pub mod refusal;
pub mod rejoin;
pub mod restore;
pub mod restore_serve;
pub mod retention;
pub mod snapshot_transfer;
pub mod store_client;
pub mod store_host;
pub mod twin;
pub mod twin_retention;
pub mod verify;

pub use api::{ApiError, Durability, Request, Response, Status};
pub use client::{Appended, Client, ClientError, ClientOptions, FrameHead, Tailing};
pub use primary::{Primary, PrimaryOptions, TwinPolicy};
pub use refusal::{ReadRefusal, WriteRefusal};
pub use twin::{Twin, TwinOptions, TwinStatus};
