//! Who may write each half of the receive ring, for zero-copy reads.
//!
//! Bytes are lent to the application (as `&[u8]`) only from a half the peer can no longer
//! write. Each half is reachable through one key at a time: first through a registration of
//! that half alone (its key goes out in the connection data, or in the first SGL update, before
//! the queue pair could bind anything), later through a memory window bound over a second
//! registration of that half (MW_BIND only). Revoking the first is a deregistration, revoking a
//! window a local invalidation; a half revoked for a lend is granted again through its window,
//! bound with a new key. Revocation is lazy: a half that is never lent keeps its key from one
//! grant to the next, so a stream that only copies pays nothing.
//!
//! Each half has registrations of its own because some devices (rxe) check an access through a
//! window against the registration under it rather than the window's range.

/// The keys the driver registered for a zero-copy receive ring, per half.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RingKeys {
    /// The rkey of each half's first registration (remote write on that half only).
    pub(crate) initial: [u32; 2],
    /// The allocated rkey of the memory window over each half.
    pub(crate) window: [u32; 2],
}

/// How the peer may reach one half.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum HalfAccess {
    /// Through `key`: the half's first registration (`initial`) or its bound window.
    Granted { key: u32, initial: bool },
    /// A revocation of `key` is under way.
    Revoking { key: u32 },
    /// Nothing grants the peer access.
    Revoked,
}

/// A revocation the driver must carry out; it reports the end with [`RingAccess::revoked`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Revoke {
    /// Deregister the half's first registration (key `key`); done when the call returns.
    Deregister { half: usize, key: u32 },
    /// Post a local invalidation of the half's window key `key`; done at its completion.
    Invalidate { half: usize, key: u32 },
}

/// A window bind the driver must post before the SGL update that grants the half.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Bind {
    pub(crate) half: usize,
    /// The window's key once bound (the previous one with its low byte moved on).
    pub(crate) rkey: u32,
}

/// The access state of both halves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RingAccess {
    halves: [HalfAccess; 2],
    /// The current key of each half's window (its last bind's, or the allocated one).
    window_keys: [u32; 2],
    /// A revocation of some key of the half failed: that key may still reach it, so the half is
    /// never lent again (its bytes are copied). Leak rather than reuse.
    unrevocable: [bool; 2],
}

/// `ibv_inc_rkey`: the key a bind gives a window, so that a key granted before cannot reach
/// what the window exposes now.
fn next_key(key: u32) -> u32 {
    (key & 0xffff_ff00) | (key.wrapping_add(1) & 0xff)
}

impl RingAccess {
    pub(crate) fn new(keys: RingKeys) -> Self {
        RingAccess {
            halves: keys
                .initial
                .map(|key| HalfAccess::Granted { key, initial: true }),
            window_keys: keys.window,
            unrevocable: [false; 2],
        }
    }

    /// The key to grant `half` with; a [`Bind`] to post first when the half's access was
    /// revoked (or is being revoked: the device runs the invalidation before the bind).
    pub(crate) fn grant(&mut self, half: usize) -> (u32, Option<Bind>) {
        match self.halves[half] {
            HalfAccess::Granted { key, .. } => (key, None),
            HalfAccess::Revoking { .. } | HalfAccess::Revoked => {
                let rkey = next_key(self.window_keys[half]);
                self.window_keys[half] = rkey;
                self.halves[half] = HalfAccess::Granted {
                    key: rkey,
                    initial: false,
                };
                (rkey, Some(Bind { half, rkey }))
            }
        }
    }

    /// Starts revoking the peer's access to `half`, if it has any and no revocation is under
    /// way.
    pub(crate) fn begin_revoke(&mut self, half: usize) -> Option<Revoke> {
        let HalfAccess::Granted { key, initial } = self.halves[half] else {
            return None;
        };
        if self.unrevocable[half] {
            return None;
        }
        self.halves[half] = HalfAccess::Revoking { key };
        Some(if initial {
            Revoke::Deregister { half, key }
        } else {
            Revoke::Invalidate { half, key }
        })
    }

    /// The revocation of `key` on `half` finished. A revocation overtaken by a new grant (the
    /// half was consumed by copying and granted again meanwhile) changes nothing.
    pub(crate) fn revoked(&mut self, half: usize, key: u32) {
        if self.halves[half] == (HalfAccess::Revoking { key }) {
            self.halves[half] = HalfAccess::Revoked;
        }
    }

    /// The revocation of `key` on `half` failed (a flushed or failed invalidation): the key may
    /// still reach the half, whichever key grants it now, so the half is never lent again.
    pub(crate) fn revoke_failed(&mut self, half: usize, _key: u32) {
        self.unrevocable[half] = true;
    }

    /// Whether a revocation on `half` failed, so its bytes can only be copied.
    pub(crate) fn is_unrevocable(&self, half: usize) -> bool {
        self.unrevocable[half]
    }

    /// Whether the peer can reach `half` through nothing.
    pub(crate) fn is_revoked(&self, half: usize) -> bool {
        !self.unrevocable[half] && self.halves[half] == HalfAccess::Revoked
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn access() -> RingAccess {
        RingAccess::new(RingKeys {
            initial: [0x100, 0x200],
            window: [0x3ff, 0x400],
        })
    }

    #[test]
    fn halves_keep_their_key_until_revoked() {
        let mut a = access();
        assert_eq!(a.grant(1), (0x200, None));
        assert_eq!(a.grant(1), (0x200, None));
        assert!(!a.is_revoked(0));
    }

    #[test]
    fn the_first_registration_is_deregistered_then_the_window_is_bound_with_a_new_key() {
        let mut a = access();
        assert_eq!(
            a.begin_revoke(0),
            Some(Revoke::Deregister {
                half: 0,
                key: 0x100
            })
        );
        assert_eq!(a.begin_revoke(0), None, "one revocation at a time");
        assert!(!a.is_revoked(0));
        a.revoked(0, 0x100);
        assert!(a.is_revoked(0));
        // The window's low byte wraps within the key; the index bits stay.
        assert_eq!(
            a.grant(0),
            (
                0x300,
                Some(Bind {
                    half: 0,
                    rkey: 0x300
                })
            )
        );
        assert_eq!(
            a.begin_revoke(0),
            Some(Revoke::Invalidate {
                half: 0,
                key: 0x300
            })
        );
        a.revoked(0, 0x300);
        assert_eq!(
            a.grant(0),
            (
                0x301,
                Some(Bind {
                    half: 0,
                    rkey: 0x301
                })
            )
        );
    }

    #[test]
    fn a_revocation_overtaken_by_a_grant_changes_nothing() {
        let mut a = access();
        let Some(Revoke::Invalidate { .. } | Revoke::Deregister { .. }) = a.begin_revoke(1) else {
            panic!("half 1 was granted");
        };
        // Consumed by copying and granted again before the revocation finished.
        let (key, bind) = a.grant(1);
        assert_eq!(
            bind,
            Some(Bind {
                half: 1,
                rkey: 0x401
            })
        );
        a.revoked(1, 0x200);
        assert!(!a.is_revoked(1));
        assert_eq!(a.grant(1), (key, None));
    }

    #[test]
    fn a_failed_revocation_of_an_overtaken_key_keeps_the_half_from_being_lent() {
        let mut a = access();
        // Half 0 revoked, granted through its window (key 0x300), revocation of 0x300 begun.
        a.begin_revoke(0);
        a.revoked(0, 0x100);
        let (old, _) = a.grant(0);
        assert_eq!(
            a.begin_revoke(0),
            Some(Revoke::Invalidate { half: 0, key: old })
        );
        // Copied and granted again (0x301) before the invalidation of 0x300 completed.
        let (new, _) = a.grant(0);
        assert_ne!(old, new);
        a.begin_revoke(0);
        // The invalidation of 0x300 fails, that of 0x301 succeeds: 0x300 may still reach it.
        a.revoke_failed(0, old);
        a.revoked(0, new);
        assert!(
            !a.is_revoked(0),
            "a key that failed to go still reaches the half"
        );
        assert!(a.is_unrevocable(0));
        assert_eq!(a.begin_revoke(0), None, "nothing revokes it any more");
        a.grant(0);
        assert!(!a.is_revoked(0));
        assert!(!a.is_unrevocable(1), "the other half is untouched");
    }
}
