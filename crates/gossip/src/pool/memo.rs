//! What the pool's joins remember of the compressed answers they decoded.
//!
//! In a join storm the members of one process read the same bytes many
//! times over: the embedded server shares one encoding between the joins
//! of 250 ms, and at 10,000 members each is ~1.3 MB of LZW that takes the
//! load box tens of milliseconds to decode. The joins of a storm overlap,
//! so remembering only the last answer decoded is not enough: a second
//! answer arriving while the first is still being decoded would be decoded
//! again, and two encodings read in turn would each push the other out.
//! [`Memos`] therefore keeps the last few answers, each known by its
//! length and the CRC-32 of its head, and the one being decoded: a join
//! that finds its answer being decoded waits for that decoding (its own
//! bytes wait in its socket, as they would behind a slow reader) and then
//! recalls the count. A decoding that fails or is abandoned wakes its
//! waiters, and the first of them decodes in its place.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::Notify;

/// Answers remembered at once (those of two seconds of a storm's
/// encodings, at the embedded server's four a second).
const KEPT: usize = 8;

/// An answer as the joins know it before reading all of it: its length and
/// the CRC-32 of its head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Key {
    pub len: usize,
    pub head: u32,
}

/// What is known of one answer (`L`: what it taught).
#[derive(Debug)]
enum Known<L> {
    /// Some join is decoding it; woken when that ends.
    Decoding(Arc<Notify>),
    /// Decoded: the CRC-32 of all of it and what it taught.
    Done { whole: u32, learnt: L },
}

/// The answers the pool's joins remember, newest last, with what each
/// taught (`L`).
#[derive(Debug)]
pub(super) struct Memos<L> {
    kept: Mutex<VecDeque<(Key, Known<L>)>>,
}

impl<L> Default for Memos<L> {
    fn default() -> Self {
        Memos {
            kept: Mutex::default(),
        }
    }
}

/// What a join does with its answer.
pub(super) enum Step<'a, L: Copy> {
    /// Read it over and take this count, if all of it has this CRC-32.
    Recall { whole: u32, learnt: L },
    /// Wait for the decoding under way (the future given), then look again.
    Wait(Arc<Notify>),
    /// Decode it: this join is the one that does.
    Decode(Decoding<'a, L>),
}

impl<L: Copy> Memos<L> {
    fn lock(&self) -> MutexGuard<'_, VecDeque<(Key, Known<L>)>> {
        // Nothing is left half-done under the lock by a panic.
        self.kept.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// What a join whose answer is `key` does with it. A [`Step::Wait`]'s
    /// notification is registered before the lock is let go, so a decoding
    /// that ends in between is not missed: await `notified()` on it at once
    /// (see [`Memos::wait`]).
    pub(super) fn look(&self, key: Key) -> Step<'_, L> {
        let mut kept = self.lock();
        match kept.iter().find(|(k, _)| *k == key).map(|(_, v)| v) {
            Some(Known::Done { whole, learnt }) => Step::Recall {
                whole: *whole,
                learnt: *learnt,
            },
            Some(Known::Decoding(n)) => Step::Wait(n.clone()),
            None => {
                if kept.len() == KEPT {
                    // The oldest decoded one makes room; with every place
                    // being decoded, this one is decoded unremembered.
                    match kept
                        .iter()
                        .position(|(_, v)| matches!(v, Known::Done { .. }))
                    {
                        Some(i) => drop(kept.remove(i)),
                        None => {
                            return Step::Decode(Decoding {
                                memos: self,
                                key,
                                notify: None,
                            });
                        }
                    }
                }
                let notify = Arc::new(Notify::new());
                kept.push_back((key, Known::Decoding(notify.clone())));
                Step::Decode(Decoding {
                    memos: self,
                    key,
                    notify: Some(notify),
                })
            }
        }
    }

    /// Waits for the decoding `key` was found under (`look` said
    /// [`Step::Wait`]) to end, unless it ended already.
    pub(super) async fn wait(&self, key: Key, notify: Arc<Notify>) {
        let woken = notify.notified();
        tokio::pin!(woken);
        // Registered now: a decoding ending from here on wakes it.
        woken.as_mut().enable();
        let still = self
            .lock()
            .iter()
            .any(|(k, v)| *k == key && matches!(v, Known::Decoding(n) if Arc::ptr_eq(n, &notify)));
        if still {
            woken.await;
        }
    }

    /// An answer recalled for `key` whose bytes ended otherwise: forgotten,
    /// so the next one is decoded.
    pub(super) fn forget(&self, key: Key, whole: u32) {
        self.lock().retain(|(k, v)| {
            !(*k == key && matches!(v, Known::Done { whole: w, .. } if *w == whole))
        });
    }

    /// The decoded answers whose count `taught` picks, made to say `learnt` and
    /// its CRC-32 turned by `whole_off` (a test's forgery).
    #[cfg(test)]
    pub(super) fn forge(&self, taught: impl Fn(&L) -> bool, whole_off: u32, learnt: L) {
        for (_, v) in self.lock().iter_mut() {
            if let Known::Done { whole, learnt: l } = &*v
                && taught(l)
            {
                *v = Known::Done {
                    whole: whole ^ whole_off,
                    learnt,
                };
            }
        }
    }

    #[cfg(test)]
    pub(super) fn held(&self) -> usize {
        self.lock().len()
    }
}

/// The one join decoding an answer: [`Decoding::done`] remembers what it
/// taught; dropped before that (the read failed, or the join was given up),
/// it is forgotten. Either way, the joins waiting for it wake.
pub(super) struct Decoding<'a, L: Copy> {
    memos: &'a Memos<L>,
    key: Key,
    /// `None`: decoded unremembered (every place was being decoded).
    notify: Option<Arc<Notify>>,
}

impl<L: Copy> Decoding<'_, L> {
    /// Decoded: `whole` is the CRC-32 of all of it.
    pub(super) fn done(mut self, whole: u32, learnt: L) {
        self.end(Some(Known::Done { whole, learnt }));
    }

    fn end(&mut self, then: Option<Known<L>>) {
        let Some(notify) = self.notify.take() else {
            return;
        };
        let mut kept = self.memos.lock();
        let mine = kept.iter().position(|(k, v)| {
            *k == self.key && matches!(v, Known::Decoding(n) if Arc::ptr_eq(n, &notify))
        });
        if let Some(i) = mine {
            match then {
                Some(known) => kept[i].1 = known,
                None => drop(kept.remove(i)),
            }
        }
        drop(kept);
        notify.notify_waiters();
    }
}

impl<L: Copy> Drop for Decoding<'_, L> {
    fn drop(&mut self) {
        self.end(None);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What an answer taught, in these tests: a number.
    type Memos = super::Memos<u64>;

    const A: Key = Key { len: 10, head: 1 };

    #[test]
    fn an_answer_is_decoded_by_one_join_and_recalled_by_the_others() {
        let m = Memos::default();
        let Step::Decode(d) = m.look(A) else {
            panic!("the first join decodes")
        };
        assert!(matches!(m.look(A), Step::Wait(_)), "the second waits");
        d.done(7, 3);
        let Step::Recall { whole, learnt } = m.look(A) else {
            panic!("recalled")
        };
        assert_eq!((whole, learnt), (7, 3));
        m.forget(A, 7);
        assert!(
            matches!(m.look(A), Step::Decode(_)),
            "forgotten: decoded again"
        );
    }

    #[tokio::test]
    async fn a_decoding_given_up_wakes_its_waiters_and_the_next_decodes() {
        let m = Memos::default();
        let Step::Decode(d) = m.look(A) else { panic!() };
        let Step::Wait(n) = m.look(A) else { panic!() };
        let waiting = m.wait(A, n);
        drop(d);
        // Woken (or never asleep): this returns.
        waiting.await;
        let next = m.look(A);
        assert!(matches!(next, Step::Decode(_)), "the next one decodes");
        assert_eq!(m.held(), 1, "only the new decoding is held");
    }

    #[tokio::test(start_paused = true)]
    async fn a_waiter_wakes_when_the_decoding_ends() {
        let m = Arc::new(Memos::default());
        let Step::Decode(d) = m.look(A) else { panic!() };
        let Step::Wait(n) = m.look(A) else { panic!() };
        let m2 = m.clone();
        let waiter = tokio::spawn(async move {
            m2.wait(A, n).await;
            matches!(m2.look(A), Step::Recall { whole: 5, .. })
        });
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished(), "it waits while the decoding runs");
        d.done(5, 1);
        assert!(waiter.await.unwrap(), "and recalls its count after");
    }

    #[test]
    fn at_most_kept_answers_are_held_and_the_oldest_decoded_makes_room() {
        let m = Memos::default();
        let key = |i| Key { len: i, head: 0 };
        let mut open = Vec::new();
        for i in 0..KEPT {
            let Step::Decode(d) = m.look(key(i)) else {
                panic!()
            };
            if i == 3 {
                d.done(0, 0);
            } else {
                open.push(d);
            }
        }
        // Full: the one decoded (3) makes room for a new one.
        let Step::Decode(d) = m.look(key(100)) else {
            panic!()
        };
        assert!(d.notify.is_some(), "remembered");
        assert_eq!(m.held(), KEPT);
        // Every place being decoded: 3 is decoded again, unremembered.
        let Step::Decode(again) = m.look(key(3)) else {
            panic!()
        };
        assert!(again.notify.is_none());
        drop((d, again, open));
        assert_eq!(m.held(), 0, "each given up is forgotten");
    }
}
