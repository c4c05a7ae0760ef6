//! Moving a box's state between boxes: a restore (the box asking), the
//! snapshot transfer under it, and serving a restore (the box answering).
//! Owns those streams and their files; it does not touch the replication
//! session between a primary and its twin, nor decide failover.

pub mod restore;
pub mod restore_serve;
pub mod snapshot_transfer;
