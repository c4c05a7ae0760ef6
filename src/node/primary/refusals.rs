//! Every refusal a client meets, counted by its name: an error answered
//! ([`crate::node::api::ApiError::name`]), or a connection or stream cut ([`Cut`]). The
//! status and `/metrics` show them, so what clients run into is seen
//! without reading their logs.

use std::collections::BTreeMap;
use std::sync::Mutex;

use crate::node::api::Response;

/// A connection or stream the primary cut, by name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Cut {
    /// An idle connection closed for a newer one of the same client.
    Reclaimed,
    /// A stream whose first request did not arrive within the deadline.
    RequestLate,
    /// A request or piped message that does not decode.
    Undecodable,
    /// An answer the client did not take within the send deadline: its
    /// stream is reset.
    SendStalled,
    /// An answer cut after its head because what it sends failed to read.
    ReadFailed,
}

impl Cut {
    pub(super) fn name(self) -> &'static str {
        match self {
            Cut::Reclaimed => "Cut.Reclaimed",
            Cut::RequestLate => "Cut.RequestLate",
            Cut::Undecodable => "Cut.Undecodable",
            Cut::SendStalled => "Cut.SendStalled",
            Cut::ReadFailed => "Cut.ReadFailed",
        }
    }

    /// The application code a stream is reset, or a connection closed,
    /// with (a request that does not decode is answered instead).
    pub(super) fn code(self) -> u32 {
        match self {
            Cut::ReadFailed => 3,
            Cut::SendStalled => 8,
            Cut::RequestLate => 9,
            Cut::Undecodable => 0,
            Cut::Reclaimed => super::seats::CLOSE_RECLAIMED,
        }
    }
}

/// Counts by name.
#[derive(Debug, Default)]
pub(super) struct Refusals(Mutex<BTreeMap<&'static str, u64>>);

impl Refusals {
    pub(super) fn note(&self, name: &'static str) {
        *self
            .0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(name)
            .or_default() += 1;
    }

    /// Count `resp` when it is an error; answers it.
    pub(super) fn answered(&self, resp: Response) -> Response {
        if let Response::Error(e) = &resp {
            self.note(e.name());
        }
        resp
    }

    pub(super) fn snapshot(&self) -> BTreeMap<String, u64> {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(|(k, v)| ((*k).to_owned(), *v))
            .collect()
    }
}
