//! Who may acknowledge what: the rule a primary applies to every writing
//! request before it appends, and again before it answers.

/// What a writing request may become, decided before anything is
/// appended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Admit {
    /// Append, then answer once durable here.
    Local,
    /// Append, then wait for the twin under the policy.
    Twin,
    /// Append, then answer `local` at once: no twin is configured and the
    /// policy falls back to local durability.
    LocalWithoutTwin,
}

/// Why a writing request is refused with nothing appended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NotAdmitted {
    /// A newer epoch exists: this primary acknowledges nothing.
    Fenced,
    /// `twin` durability, and no twin is configured to give it.
    NoTwin,
}

/// The primary as a request finds it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AckState {
    /// A newer epoch fenced this primary.
    pub fenced: bool,
    /// A twin is pinned.
    pub twin_configured: bool,
    /// The policy for an absent twin falls back to local durability.
    pub falls_back: bool,
}

/// Decide before appending: a fenced primary appends nothing, and a
/// `twin` request that no twin can ever acknowledge is refused at once
/// (or answered `local` under a fallback policy) rather than left
/// waiting.
pub fn admit(state: AckState, wants_twin: bool) -> Result<Admit, NotAdmitted> {
    if state.fenced {
        return Err(NotAdmitted::Fenced);
    }
    match (wants_twin, state.twin_configured, state.falls_back) {
        (false, _, _) => Ok(Admit::Local),
        (true, true, _) => Ok(Admit::Twin),
        (true, false, true) => Ok(Admit::LocalWithoutTwin),
        (true, false, false) => Err(NotAdmitted::NoTwin),
    }
}

/// Decide before answering a frame appended here: a primary fenced since
/// the append acknowledges it at no durability.
pub fn may_acknowledge(fenced: bool) -> Result<(), NotAdmitted> {
    if fenced {
        Err(NotAdmitted::Fenced)
    } else {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fenced_primary_admits_nothing_and_no_twin_is_refused_at_once() {
        let st = |fenced, twin_configured, falls_back| AckState {
            fenced,
            twin_configured,
            falls_back,
        };
        for wants_twin in [false, true] {
            for configured in [false, true] {
                for falls_back in [false, true] {
                    assert_eq!(
                        admit(st(true, configured, falls_back), wants_twin),
                        Err(NotAdmitted::Fenced)
                    );
                }
            }
        }
        assert_eq!(admit(st(false, false, false), false), Ok(Admit::Local));
        assert_eq!(
            admit(st(false, false, false), true),
            Err(NotAdmitted::NoTwin)
        );
        assert_eq!(
            admit(st(false, false, true), true),
            Ok(Admit::LocalWithoutTwin)
        );
        assert_eq!(admit(st(false, true, false), true), Ok(Admit::Twin));
        assert_eq!(may_acknowledge(true), Err(NotAdmitted::Fenced));
        assert_eq!(may_acknowledge(false), Ok(()));
    }
}
