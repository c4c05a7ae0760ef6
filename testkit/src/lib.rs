//! What the tests, benches and drills share to run daemons: free loopback
//! ports, child processes that are killed when their owner lets go of
//! them, what a process spends, waits on state instead of sleeps, a
//! real etcd on loopback for the failover tests, a real S3 server
//! (Garage) for the archive's, and relays that cut a
//! link on demand.
//!
//! A harness, not a product: its functions panic with a message where a
//! test would, except where a drill needs the error to report it.

pub mod child;
pub mod etcd;
pub mod garage;
pub mod ports;
pub mod procfs;
pub mod proxy;
pub mod wait;

pub use child::Guard;
pub use ports::{free_tcp, free_udp};
pub use wait::{poll, until, until_blocking};
