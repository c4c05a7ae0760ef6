//! What a client call fails at, apart from the client so the pieces of
//! the client (the pipe of small requests, the store's calls) name it
//! without depending on one another.

use std::time::Duration;

use super::api::ApiError;
use crate::net::NetError;

/// What a client call fails at.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error(transparent)]
    Net(#[from] NetError),
    #[error(transparent)]
    Api(#[from] ApiError),
    /// Finding the primary failed: the locator (etcd) did not answer, or
    /// names none, and no box named one.
    #[error("finding the primary: {0}")]
    Locate(String),
    #[error("unexpected answer: {0}")]
    Unexpected(String),
    /// Reading the git repository to import failed.
    #[error("import: {0}")]
    Import(String),
    /// The primary did not answer, or did not move a piece of a transfer,
    /// within the deadline: it is stopped, overloaded or cut off. What was
    /// asked may have been done all the same.
    #[error(
        "no answer from the primary within {after:?} (the client's deadline, --timeout): it may \
         be stopped, overloaded or cut off, and what was asked may have been done all the same \
         (a `twin` write, for one, may be durable on the primary and waiting for its twin: \
         see `primary status`)"
    )]
    Deadline { after: Duration },
}
