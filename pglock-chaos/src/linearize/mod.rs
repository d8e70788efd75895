//! Whether a history of lock operations fits a model: a linearizability search.
//!
//! Each [`Operation`] has a call time and, if its outcome is known, a return time. The history
//! is linearizable when every operation with a known outcome can be given one instant between
//! its call and its return, such that applying the operations in the order of those instants
//! to the [`Model`], from its initial state, never makes a step the model refuses. An operation
//! whose outcome is unknown (a timeout, an error, a killed worker) has no return: it may take
//! effect at any instant after its call, or never.
//!
//! The search is the one of Wing and Gong, with Lowe's memoisation, as Porcupine and Knossos
//! run it: walk the calls and returns in time order, try to take effect at each call, and undo
//! the last choice when a return is reached whose operation has not taken effect yet. A pair
//! (operations taken effect, model state) that was reached before is not explored again. The
//! set of operations is kept as a 128-bit hash of its members (Zobrist hashing), so that a
//! memo entry costs a few words whatever the history's length; two sets would have to share
//! a hash for the search to skip a state it should not, a chance far below 1 in 10^20 for the
//! histories here.
//!
//! Histories split by key ([`check_by_key`]): a lock's operations on one key never constrain
//! another key's, so each key is searched alone.
//!
//! [`models`] has the models: a mutex, a reader-writer lock and a counting semaphore.
//!
//! ```
//! use pglock::LockMode;
//! use pglock_chaos::linearize::models::{Action, LockCall, Mutex};
//! use pglock_chaos::linearize::{Operation, Verdict, check};
//!
//! let op = |holder, action, call, ret| Operation {
//!     input: LockCall { holder, action },
//!     call,
//!     ret,
//! };
//! // Holder 1 takes the lock and lets it go; holder 2's acquisition timed out (unknown), yet
//! // holder 2 later released: its acquisition must have taken effect, after holder 1's release.
//! let history = [
//!     op(1, Action::Acquire(LockMode::Exclusive), 0, Some(10)),
//!     op(2, Action::Acquire(LockMode::Exclusive), 5, None),
//!     op(1, Action::Release, 20, Some(30)),
//!     op(2, Action::Release, 40, Some(50)),
//! ];
//! assert_eq!(check(&Mutex, &history, 1_000).verdict, Verdict::Linearizable);
//! ```

pub mod models;

use std::collections::{BTreeMap, HashSet};
use std::hash::Hash;

use crate::rng::Rng;

/// What the history is checked against: a state machine whose steps may be refused.
pub trait Model {
    /// What one operation asks of the model.
    type Input;
    /// The model's state.
    type State: Clone + Eq + Hash;

    /// The state before any operation.
    fn init(&self) -> Self::State;

    /// The state after `input` in `state`, or `None` when the model cannot make that step.
    fn step(&self, state: &Self::State, input: &Self::Input) -> Option<Self::State>;
}

/// One operation of a history.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Operation<I> {
    /// What it asked.
    pub input: I,
    /// When it was called (any clock, as long as the whole history uses the same one).
    pub call: u64,
    /// When it returned with a known outcome; `None` when the outcome is unknown, so that it
    /// may take effect at any time after its call, or not at all.
    pub ret: Option<u64>,
}

/// What the search concluded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Some order of the operations fits the model.
    Linearizable,
    /// No order fits.
    NotLinearizable(Stuck),
    /// The search took more steps than it was allowed, and stopped.
    Undecided,
}

/// Where a search that found no order got furthest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stuck {
    /// The longest run of operations, in the order they took effect, that the search fitted
    /// (indices into the history).
    pub longest: Vec<usize>,
    /// The operation whose return came before it could take effect after them.
    pub blocked: usize,
}

/// A search's verdict and cost.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Search {
    /// The verdict.
    pub verdict: Verdict,
    /// How many steps the search took: each is one attempt, or one undone choice.
    pub steps: u64,
}

/// Searches for an order of `history` that fits `model`, in at most `max_steps` steps.
pub fn check<M: Model>(model: &M, history: &[Operation<M::Input>], max_steps: u64) -> Search {
    Searcher::new(model, history).run(max_steps)
}

/// Checks each key's operations alone ([`check`]), and returns the verdicts by key.
pub fn check_by_key<K: Ord + Clone, M: Model>(
    model: &M,
    history: &[(K, Operation<M::Input>)],
    max_steps: u64,
) -> BTreeMap<K, Search>
where
    M::Input: Clone,
{
    let mut keys: BTreeMap<K, Vec<Operation<M::Input>>> = BTreeMap::new();
    for (key, op) in history {
        keys.entry(key.clone()).or_default().push(op.clone());
    }
    keys.into_iter()
        .map(|(key, ops)| (key, check(model, &ops, max_steps)))
        .collect()
}

/// A call or a return, as a node of a doubly linked list in time order.
#[derive(Debug, Clone, Copy)]
struct Entry {
    op: usize,
    is_return: bool,
}

/// The list's head sentinel; the tail sentinel is the last node.
const HEAD: usize = 0;

/// The calls and returns not yet taken effect, in time order: a doubly linked list whose nodes
/// are taken out when their operation takes effect and put back when that is undone.
struct Entries {
    /// Node `i + 1` is `entries[i]`; node 0 is the head, node `entries.len() + 1` the tail.
    entries: Vec<Entry>,
    next: Vec<usize>,
    prev: Vec<usize>,
    call_node: Vec<usize>,
    return_node: Vec<Option<usize>>,
}

impl Entries {
    fn new<I>(history: &[Operation<I>]) -> Entries {
        let mut timed = Vec::with_capacity(history.len() * 2);
        for (op, operation) in history.iter().enumerate() {
            timed.push((operation.call, false, op));
            if let Some(ret) = operation.ret {
                timed.push((ret.max(operation.call), true, op));
            }
        }
        // At equal times calls come first: operations that touch are taken as concurrent.
        timed.sort_unstable();
        let entries: Vec<Entry> = timed
            .into_iter()
            .map(|(_, is_return, op)| Entry { op, is_return })
            .collect();
        let nodes = entries.len() + 2;
        let mut call_node = vec![0; history.len()];
        let mut return_node = vec![None; history.len()];
        for (i, entry) in entries.iter().enumerate() {
            if entry.is_return {
                return_node[entry.op] = Some(i + 1);
            } else {
                call_node[entry.op] = i + 1;
            }
        }
        Entries {
            entries,
            next: (1..=nodes).collect(),
            prev: (0..nodes).map(|n| n.saturating_sub(1)).collect(),
            call_node,
            return_node,
        }
    }

    /// The entry at `node`, or `None` at the tail.
    fn at(&self, node: usize) -> Option<Entry> {
        (node <= self.entries.len()).then(|| self.entries[node - 1])
    }

    fn unlink(&mut self, node: usize) {
        let (p, n) = (self.prev[node], self.next[node]);
        self.next[p] = n;
        self.prev[n] = p;
    }

    /// Puts back a node taken out by [`unlink`](Self::unlink): valid in the reverse order of
    /// the unlinks, which the search's stack guarantees.
    fn relink(&mut self, node: usize) {
        let (p, n) = (self.prev[node], self.next[node]);
        self.next[p] = node;
        self.prev[n] = node;
    }

    /// Takes `op`'s call and return out of the list.
    fn lift(&mut self, op: usize) {
        self.unlink(self.call_node[op]);
        if let Some(ret) = self.return_node[op] {
            self.unlink(ret);
        }
    }

    /// Undoes the last [`lift`](Self::lift), of `op`.
    fn unlift(&mut self, op: usize) {
        if let Some(ret) = self.return_node[op] {
            self.relink(ret);
        }
        self.relink(self.call_node[op]);
    }
}

/// Which candidates a walk of the list tries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Those of operations with a known outcome.
    Known,
    /// Those of unknown outcome, once the others are exhausted.
    Unknown,
}

/// A search in progress: the operations taken effect so far, in order, and the model's state.
struct Searcher<'h, M: Model> {
    model: &'h M,
    history: &'h [Operation<M::Input>],
    list: Entries,
    state: M::State,
    /// The hash of the set of operations taken effect: the XOR of theirs.
    taken: u128,
    /// Random words per operation, XORed into `taken`.
    zobrist: Vec<u128>,
    /// Every (set taken effect, state) reached so far.
    seen: HashSet<(u128, M::State)>,
    /// Each choice: the operation that took effect, and the state before it.
    stack: Vec<(usize, M::State)>,
    /// Operations with a known outcome not taken effect yet.
    pending: usize,
    /// Where the search got furthest, for a verdict of no order.
    best: Option<Stuck>,
}

impl<'h, M: Model> Searcher<'h, M> {
    fn new(model: &'h M, history: &'h [Operation<M::Input>]) -> Self {
        let mut seed = Rng::new(0x9E37_79B9_7F4A_7C15);
        let zobrist = (0..history.len())
            .map(|_| (u128::from(seed.next_u64()) << 64) | u128::from(seed.next_u64()))
            .collect();
        Searcher {
            model,
            history,
            list: Entries::new(history),
            state: model.init(),
            taken: 0,
            zobrist,
            seen: HashSet::new(),
            stack: Vec::new(),
            pending: history.iter().filter(|op| op.ret.is_some()).count(),
            best: None,
        }
    }

    fn is_known(&self, op: usize) -> bool {
        self.history[op].ret.is_some()
    }

    /// Makes `op` take effect now if the model allows it and the result is new.
    fn try_take(&mut self, op: usize) -> bool {
        let Some(after) = self.model.step(&self.state, &self.history[op].input) else {
            return false;
        };
        if !self
            .seen
            .insert((self.taken ^ self.zobrist[op], after.clone()))
        {
            return false;
        }
        self.taken ^= self.zobrist[op];
        let before = std::mem::replace(&mut self.state, after);
        self.stack.push((op, before));
        self.list.lift(op);
        self.pending -= usize::from(self.is_known(op));
        true
    }

    /// Undoes the last choice, noting how far the search had got; returns the operation undone,
    /// or `None` when there was no choice left to undo.
    fn undo(&mut self, blocked: usize) -> Option<usize> {
        if self
            .best
            .as_ref()
            .is_none_or(|b| self.stack.len() > b.longest.len())
        {
            let longest = self.stack.iter().map(|(op, _)| *op).collect();
            self.best = Some(Stuck { longest, blocked });
        }
        let (op, before) = self.stack.pop()?;
        self.state = before;
        self.taken ^= self.zobrist[op];
        self.list.unlift(op);
        self.pending += usize::from(self.is_known(op));
        Some(op)
    }

    /// The search. At each point the candidates are the calls before the first pending
    /// return; those of operations with a known outcome are tried first, in time order, and
    /// only then those of unknown outcome (which usually need not take effect at all). Every
    /// candidate is still tried before a choice is undone, so the order changes the cost, not
    /// the verdict.
    fn run(mut self, max_steps: u64) -> Search {
        let (mut node, mut phase) = (self.list.next[HEAD], Phase::Known);
        let mut steps = 0;
        while self.pending > 0 {
            steps += 1;
            if steps > max_steps {
                return Search {
                    verdict: Verdict::Undecided,
                    steps,
                };
            }
            match self.list.at(node) {
                Some(Entry {
                    op,
                    is_return: false,
                }) => {
                    let candidate = self.is_known(op) == (phase == Phase::Known);
                    if candidate && self.try_take(op) {
                        (node, phase) = (self.list.next[HEAD], Phase::Known);
                    } else {
                        node = self.list.next[node];
                    }
                }
                // The first pending return (or, defensively, the list's end): every candidate
                // of this phase was tried.
                _ if phase == Phase::Known => {
                    (node, phase) = (self.list.next[HEAD], Phase::Unknown)
                }
                entry => {
                    let blocked = entry.map_or(usize::MAX, |e| e.op);
                    let Some(op) = self.undo(blocked) else {
                        let stuck = self.best.unwrap_or(Stuck {
                            longest: Vec::new(),
                            blocked,
                        });
                        return Search {
                            verdict: Verdict::NotLinearizable(stuck),
                            steps,
                        };
                    };
                    // Go on with the candidates after the one undone, in its phase.
                    phase = if self.is_known(op) {
                        Phase::Known
                    } else {
                        Phase::Unknown
                    };
                    node = self.list.next[self.list.call_node[op]];
                }
            }
        }
        Search {
            verdict: Verdict::Linearizable,
            steps,
        }
    }
}
