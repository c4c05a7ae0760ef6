//! Client connections, bounded as a whole and shared fairly.
//!
//! `max_client_connections` bounds the connections of the `read` and
//! `write` clients together; each client (a fingerprint) may hold a
//! quarter of it (at least four, or the whole when that is less), and
//! each of the two roles three quarters. An admin is refused only past its
//! own share or past the bound and [`ADMIN_RESERVE`] more: a read client
//! holding every connection it may still leaves an admin a way in.
//!
//! A client at a bound whose own connections include an idle one (no
//! request in progress) has its oldest idle one closed for the new one
//! ([`CLOSE_RECLAIMED`]): a script that runs the command line once per
//! frame leaves a connection behind each time its process dies before
//! QUIC's idle timeout, and those go first. A client with none idle is
//! refused by name ([`crate::net::CLOSE_TOO_MANY`]).

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use crate::node::api::ClientRole;

/// Admin connections taken past the bound.
pub const ADMIN_RESERVE: usize = 4;

/// The application close code of an idle client connection closed for a
/// newer one of the same client, at its share.
pub const CLOSE_RECLAIMED: u32 = 7;

/// What a connection is doing: requests in progress, and when it last
/// started or ended one (as a tick of [`TICKS`]: only the order counts).
#[derive(Debug, Default)]
pub(super) struct Activity {
    busy: AtomicUsize,
    last: AtomicU64,
}

/// A clock that only moves forward, read on every request's start and end
/// without a system call.
static TICKS: AtomicU64 = AtomicU64::new(0);

impl Activity {
    /// A request in progress, counted for as long as this lives.
    pub(super) fn busy(self: &Arc<Self>) -> Busy {
        self.busy.fetch_add(1, Ordering::SeqCst);
        self.stamp();
        Busy(self.clone())
    }

    fn stamp(&self) {
        self.last
            .store(TICKS.fetch_add(1, Ordering::Relaxed), Ordering::Relaxed);
    }

    fn idle(&self) -> bool {
        self.busy.load(Ordering::SeqCst) == 0
    }
}

/// A request in progress on a connection ([`Activity::busy`]).
pub(super) struct Busy(Arc<Activity>);

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.stamp();
        self.0.busy.fetch_sub(1, Ordering::SeqCst);
    }
}

struct Seated {
    id: u64,
    name: Arc<str>,
    role: ClientRole,
    conn: quinn::Connection,
    activity: Arc<Activity>,
}

type Table = Arc<Mutex<Vec<Seated>>>;

/// A connection's place, given back when dropped.
pub(super) struct Seat {
    id: u64,
    table: Table,
    pub(super) activity: Arc<Activity>,
}

impl Drop for Seat {
    fn drop(&mut self) {
        lock(&self.table).retain(|s| s.id != self.id);
    }
}

/// Why a connection was not seated, by name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum NoSeat {
    /// The client holds its share, every connection busy.
    ClientShare { held: usize, share: usize },
    /// Its role holds its share.
    RoleShare { role: ClientRole, share: usize },
    /// Every connection is taken.
    Full { most: usize },
}

impl NoSeat {
    /// The refusal's name, as the metrics count it.
    pub(super) fn name(&self) -> &'static str {
        match self {
            NoSeat::ClientShare { .. } => "Connection.ClientShare",
            NoSeat::RoleShare { .. } => "Connection.RoleShare",
            NoSeat::Full { .. } => "Connection.Full",
        }
    }
}

impl std::fmt::Display for NoSeat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NoSeat::ClientShare { held, share } => write!(
                f,
                "this client holds {held} connections, its share of {share}, each with a request in progress"
            ),
            NoSeat::RoleShare { role, share } => write!(
                f,
                "the {role} clients hold {share} connections, their role's share"
            ),
            NoSeat::Full { most } => {
                write!(f, "this primary serves at most {most} client connections")
            }
        }
    }
}

fn lock(t: &Table) -> std::sync::MutexGuard<'_, Vec<Seated>> {
    t.lock().unwrap_or_else(|e| e.into_inner())
}

/// The client connections served, and their bounds.
pub(super) struct Seats {
    table: Table,
    next_id: AtomicU64,
    most: usize,
    per_client: usize,
    per_role: usize,
}

impl Seats {
    /// At most `most` connections of non-admin clients.
    pub(super) fn new(most: usize) -> Seats {
        let most = most.max(1);
        let per_client = (most / 4).max(most.min(4));
        Seats {
            table: Table::default(),
            next_id: AtomicU64::new(1),
            most,
            per_client,
            per_role: (most / 4 * 3).max(per_client),
        }
    }

    /// Connections held now.
    pub(super) fn count(&self) -> usize {
        lock(&self.table).len()
    }

    /// Seat `conn` of client `name` in `role`, closing that client's
    /// oldest idle connection when it is at a bound: answers what was
    /// reclaimed with the seat.
    pub(super) fn take(
        &self,
        name: &Arc<str>,
        role: ClientRole,
        conn: &quinn::Connection,
    ) -> Result<(Seat, bool), NoSeat> {
        let mut t = lock(&self.table);
        let own = t.iter().filter(|s| s.name == *name).count();
        let non_admin = |s: &&Seated| s.role != ClientRole::Admin;
        let over = if own >= self.per_client {
            Some(NoSeat::ClientShare {
                held: own,
                share: self.per_client,
            })
        } else if role == ClientRole::Admin {
            (t.len() >= self.most + ADMIN_RESERVE).then_some(NoSeat::Full {
                most: self.most + ADMIN_RESERVE,
            })
        } else if t.iter().filter(|s| s.role == role).count() >= self.per_role {
            Some(NoSeat::RoleShare {
                role,
                share: self.per_role,
            })
        } else {
            (t.iter().filter(non_admin).count() >= self.most)
                .then_some(NoSeat::Full { most: self.most })
        };
        let mut reclaimed = false;
        if let Some(why) = over {
            let oldest = t
                .iter()
                .enumerate()
                .filter(|(_, s)| s.name == *name && s.activity.idle())
                .min_by_key(|(_, s)| s.activity.last.load(Ordering::Relaxed))
                .map(|(i, _)| i);
            let Some(i) = oldest else {
                return Err(why);
            };
            let old = t.swap_remove(i);
            old.conn.close(
                CLOSE_RECLAIMED.into(),
                b"closed for a newer connection of the same client, at its share",
            );
            reclaimed = true;
        }
        let activity = Arc::new(Activity::default());
        activity.stamp();
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        t.push(Seated {
            id,
            name: name.clone(),
            role,
            conn: conn.clone(),
            activity: activity.clone(),
        });
        Ok((
            Seat {
                id,
                table: self.table.clone(),
                activity,
            },
            reclaimed,
        ))
    }
}
