//! twinlog: a transaction log kept on two boxes.
//!
//! [`log::Log`] is the segmented transaction log every other part stands on;
//! [`wal::Wal`] is the small embedding API over the same files.

pub mod archive;
pub mod budget;
pub mod clock;
pub mod daemon;
pub mod layout;
pub mod log;
pub mod metrics;
pub mod net;
pub mod node;
pub mod objects;
pub mod publish;
pub mod pushlog;
pub mod repl;
pub mod storage;
pub mod store;
pub mod wal;
