//! A failover's I/O: the box's epochs on disk, the call a restarted
//! predecessor makes, a deposed primary's rejoin, and the divergent tail it
//! saves before cutting. Owns those files and calls; decides nothing: the
//! rules are the sans-IO machines in [`crate::repl`] (`switchover`,
//! `rejoin`, `promote`, `epochs`), which it must not duplicate. It does not
//! touch a daemon's sessions with clients or its twin.

pub mod divergent;
pub mod epoch;
pub mod last;
pub mod predecessor;
pub mod rejoin;
