//! What clients hold, bounded as a whole and shared fairly: the memory
//! requests hold whole (blobs read whole, documents, a piece in hand per
//! answer or streamed body) and the disk that staged bodies take.
//!
//! A charge is taken, before what it stands for is held, from each of the
//! bounds it falls under in turn: the client's own share (by its
//! certificate's fingerprint), its role's share (`read` and `write`), the
//! part all non-admin clients share, and the whole. A request past one of
//! them waits its turn holding nothing; so one client cannot take more
//! than its share, one role cannot starve the other, and what the
//! non-admin clients cannot take is always there for an admin.
//!
//! Charges are counted in KiB, so a budget of terabytes still fits a
//! semaphore's permit count; a charge larger than a bound takes all of it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::node::api::ClientRole;

/// The default memory budget: 512 MiB.
pub const DEFAULT_BUDGET_BYTES: u64 = 512 << 20;
/// What a streamed body holds at once in memory: the pieces on their way
/// to its staging file.
pub const STREAMED_BODY_BYTES: u64 = 2 << 20;

const UNIT: u64 = 1024;

/// One bound: a semaphore of KiB.
#[derive(Debug)]
struct Bound {
    sem: Arc<Semaphore>,
    units: u64,
}

impl Bound {
    fn new(bytes: u64) -> Bound {
        let units = (bytes / UNIT).clamp(1, Semaphore::MAX_PERMITS as u64);
        Bound {
            sem: Arc::new(Semaphore::new(units as usize)),
            units,
        }
    }

    fn in_use(&self) -> u64 {
        (self.units - self.sem.available_permits() as u64) * UNIT
    }
}

/// Who a charge is for.
#[derive(Clone, Debug)]
pub struct Holder {
    /// The client's fingerprint, as it prints.
    pub name: Arc<str>,
    pub role: ClientRole,
}

/// How a whole is shared.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Split {
    pub total: u64,
    /// One client's share.
    pub per_client: u64,
    /// The `read` role's, and the `write` role's.
    pub per_role: u64,
    /// All non-admin clients together.
    pub non_admin: u64,
}

impl Split {
    /// `per_client` for each client (at most the whole), three quarters
    /// per role and seven eighths for every non-admin client together (at
    /// least one client's share each).
    pub fn of(total: u64, per_client: u64) -> Split {
        let per_client = per_client.min(total);
        let per_role = (total / 4 * 3).max(per_client).min(total);
        let non_admin = (total / 8 * 7).max(per_role).min(total);
        Split {
            total,
            per_client,
            per_role,
            non_admin,
        }
    }
}

/// A whole, shared as [`Split`] says.
#[derive(Debug)]
pub struct Shares {
    per_client: u64,
    total: Bound,
    non_admin: Bound,
    read: Bound,
    write: Bound,
    clients: Mutex<HashMap<Arc<str>, Arc<Bound>>>,
}

/// One client's part of a whole: the bounds its charges fall under, the
/// narrowest first, resolved once for its connection.
#[derive(Clone, Debug)]
pub struct Share {
    bounds: [Option<Arc<Semaphore>>; 4],
    /// The narrowest bound's units: no charge takes more.
    most: u64,
}

/// A charge, held until dropped.
#[derive(Debug)]
pub struct Held(#[allow(dead_code)] [Option<OwnedSemaphorePermit>; 4]);

impl Shares {
    pub fn new(split: Split) -> Shares {
        Shares {
            per_client: split.per_client,
            total: Bound::new(split.total),
            non_admin: Bound::new(split.non_admin),
            read: Bound::new(split.per_role),
            write: Bound::new(split.per_role),
            clients: Mutex::new(HashMap::new()),
        }
    }

    /// `holder`'s part: its own share, its role's (an admin's none), the
    /// non-admins' (an admin's none), and the whole.
    pub fn share(&self, holder: &Holder) -> Share {
        let own = self
            .clients
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(holder.name.clone())
            .or_insert_with(|| Arc::new(Bound::new(self.per_client)))
            .clone();
        let (role, non_admin) = match holder.role {
            ClientRole::Read => (Some(&self.read), Some(&self.non_admin)),
            ClientRole::Write => (Some(&self.write), Some(&self.non_admin)),
            ClientRole::Admin => (None, None),
        };
        let bounds = [Some(own.as_ref()), role, non_admin, Some(&self.total)];
        Share {
            most: bounds.iter().flatten().map(|b| b.units).min().unwrap_or(1),
            bounds: bounds.map(|b| b.map(|b| b.sem.clone())),
        }
    }

    /// Bytes held now, by everyone.
    pub fn in_use(&self) -> u64 {
        self.total.in_use()
    }
}

impl Share {
    /// `bytes` in units: at most the narrowest bound, so that a charge
    /// larger than it takes all of that one and as much of the others.
    fn units(&self, bytes: u64) -> u32 {
        bytes
            .div_ceil(UNIT)
            .clamp(1, self.most)
            .min(u64::from(u32::MAX)) as u32
    }

    /// Hold `bytes` until the answer drops, waiting for room in each bound
    /// in turn.
    pub async fn charge(&self, bytes: u64) -> Held {
        let units = self.units(bytes);
        let mut held: [Option<OwnedSemaphorePermit>; 4] = Default::default();
        for (slot, sem) in held.iter_mut().zip(&self.bounds) {
            if let Some(sem) = sem {
                // The semaphores are never closed: they live as long as this.
                match sem.clone().acquire_many_owned(units).await {
                    Ok(p) => *slot = Some(p),
                    Err(_) => unreachable_closed(),
                }
            }
        }
        Held(held)
    }

    /// [`Share::charge`] if there is room in every bound now.
    pub fn try_charge(&self, bytes: u64) -> Option<Held> {
        let units = self.units(bytes);
        let mut held: [Option<OwnedSemaphorePermit>; 4] = Default::default();
        for (slot, sem) in held.iter_mut().zip(&self.bounds) {
            if let Some(sem) = sem {
                *slot = Some(sem.clone().try_acquire_many_owned(units).ok()?);
            }
        }
        Some(Held(held))
    }
}

#[cold]
fn unreachable_closed() -> ! {
    // A semaphore is closed only by `close`, which nothing here calls.
    panic!("a share's semaphore was closed")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn holder(s: &Shares, name: &str, role: ClientRole) -> Share {
        s.share(&Holder {
            name: name.into(),
            role,
        })
    }

    async fn poll_once<F: std::future::Future + Unpin>(f: &mut F) -> Option<F::Output> {
        use std::task::Poll;
        std::future::poll_fn(|cx| match std::pin::Pin::new(&mut *f).poll(cx) {
            Poll::Ready(v) => Poll::Ready(Some(v)),
            Poll::Pending => Poll::Ready(None),
        })
        .await
    }

    #[tokio::test]
    async fn one_client_takes_its_share_and_leaves_the_rest() {
        let s = Shares::new(Split::of(16 << 20, 4 << 20));
        let greedy = holder(&s, "a", ClientRole::Read);
        let _mine = greedy.charge(4 << 20).await;
        assert_eq!(s.in_use(), 4 << 20);
        let more = greedy.charge(1 << 20);
        tokio::pin!(more);
        assert!(
            poll_once(&mut more).await.is_none(),
            "past its share: waits"
        );
        assert!(greedy.try_charge(1).is_none());
        // Other readers find room, up to the read role's share (12 MiB).
        let _b = holder(&s, "b", ClientRole::Read).charge(4 << 20).await;
        let _d = holder(&s, "d", ClientRole::Read).charge(4 << 20).await;
        assert!(holder(&s, "e", ClientRole::Read).try_charge(1).is_none());
        // A writer may not take the admin's eighth: non-admins hold 12 of
        // their 14 MiB.
        assert!(holder(&s, "f", ClientRole::Write)
            .try_charge(4 << 20)
            .is_none());
        let _f = holder(&s, "f", ClientRole::Write).try_charge(2 << 20);
        assert!(_f.is_some(), "a writer finds what is left to non-admins");
        let admin = holder(&s, "root", ClientRole::Admin).try_charge(2 << 20);
        assert!(admin.is_some(), "an admin finds its part");
        assert_eq!(s.in_use(), 16 << 20);
    }

    #[tokio::test]
    async fn a_charge_larger_than_a_bound_takes_all_of_it() {
        assert_eq!(Split::of(4 << 20, 1 << 20).per_role, 3 << 20);
        let s = Shares::new(Split::of(4 << 20, 1 << 20));
        let all = holder(&s, "a", ClientRole::Admin).charge(1 << 40).await;
        assert_eq!(s.in_use(), 1 << 20, "the client's share: a quarter");
        drop(all);
        assert_eq!(s.in_use(), 0);
    }
}
