//! The approximate policy for fleets that publish no KV events (SGLang Model
//! Gateway's `cache_aware`): a per-router radix tree of the prompt text this
//! router sent to each worker. A request goes to the worker whose past
//! requests share the longest prefix, if the match covers more than a
//! threshold of the prompt; else to the least loaded worker; and always to the
//! least loaded one while the fleet is imbalanced. The tree is held within a
//! bound in bytes (its text and an estimate of each node's own memory):
//! an insert that takes it over trims it, least recently used leaves first,
//! to seven eighths of the bound, so it never waits for the periodic trim.
//! A placement stays routable for `ttl_ms` after the worker was last sent
//! it (SMG's `--cache-ttl-secs`, approximating how long an engine keeps a
//! prefix): an older one is not matched, and is forgotten at the next commit
//! an eighth of the TTL after the last such sweep. Time is the request's
//! (`RequestInfo::at_ms`, the caller's clock): the policy reads no clock.
//!
//! The tree learns on `commit` (a request really sent), never on `select`
//! (which an explain endpoint may call), and it remembers workers by
//! [`WorkerId`]: what one worker was sent stays with it whatever the order or
//! the set of candidates later, until the fleet says it left
//! (`remove_worker`). Ties on load go to the lowest id, so a choice does not
//! depend on the order the candidates come in.
//!
//! The tree works on bytes of UTF-8 text (a character tree would count a
//! CJK character as one unit instead of three; the ratio differs, the choice
//! rarely does).

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use router_types::WorkerId;

use crate::simple::check;
use crate::{Candidate, Decision, Policy, PolicyError, Reason, RequestInfo};

/// The knobs, with SGLang Model Gateway's defaults.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ApproxTreeConfig {
    /// Follow the tree only if the match covers more than this fraction of the prompt.
    pub cache_threshold: f64,
    /// The fleet is imbalanced when the most and least loaded differ by more than this many requests...
    pub balance_abs: u32,
    /// ...and the most loaded has more than this multiple of the least.
    pub balance_rel: f64,
    /// Upper bound on the bytes the tree holds: its text and [`NODE_BYTES`] per node. The
    /// default, 32 MiB, is some eight million tokens of text the workers were sent, more than
    /// eight engines with a million-token KV cache each hold; SGLang Model Gateway's
    /// `--max-tree-size` (64 Mi characters) counts per worker and not the nodes.
    pub max_tree_bytes: usize,
    /// Milliseconds a placement stays routable after its worker was last sent it (SMG's
    /// `--cache-ttl-secs`, 180 s); 0: until the bound trims it.
    pub ttl_ms: u64,
}

/// A use's stamp: the request's milliseconds above the commit's sequence number, so stamps
/// order uses (the trim's least recently used) and age them (the TTL).
const SEQ_BITS: u32 = 24;

/// What one node of the tree costs besides its text, as the bound counts it: the node itself
/// and the first allocations of its two maps (children, workers).
pub const NODE_BYTES: usize = std::mem::size_of::<TreeNode>() + 160;

/// A radix tree of text → the workers that were sent it.
#[derive(Debug, Default)]
pub struct ApproxTree {
    nodes: Vec<TreeNode>,
    free: Vec<usize>,
    /// Text bytes held.
    bytes: usize,
    /// Nodes in use, the root apart.
    live: usize,
    /// Placements stamped before this were forgotten by the last sweep.
    swept_before: u64,
}

#[derive(Debug, Default)]
struct TreeNode {
    /// The edge label leading here.
    label: Vec<u8>,
    parent: usize,
    children: HashMap<u8, usize>,
    /// Workers whose requests passed through here, with the last time.
    workers: HashMap<WorkerId, u64>,
    live: bool,
}

/// The policy: the tree behind a mutex, and a logical clock.
#[derive(Debug)]
pub struct ApproxTreePolicy {
    config: ApproxTreeConfig,
    tree: Mutex<ApproxTree>,
    clock: AtomicU64,
}

const ROOT: usize = 0;

// === impl ApproxTreeConfig ===

impl Default for ApproxTreeConfig {
    fn default() -> Self {
        Self { cache_threshold: 0.3, balance_abs: 64, balance_rel: 1.5, max_tree_bytes: 1 << 25, ttl_ms: 180_000 }
    }
}

impl ApproxTreeConfig {
    /// The stamp of a use at `at_ms` (0: no time, the sequence alone) with sequence number `seq`.
    pub fn stamp(at_ms: u64, seq: u64) -> u64 {
        if at_ms == 0 { seq } else { (at_ms << SEQ_BITS) | (seq & ((1 << SEQ_BITS) - 1)) }
    }

    /// The oldest stamp still routable at `at_ms` (0: every one).
    pub fn fresh_since(&self, at_ms: u64) -> u64 {
        match at_ms.checked_sub(self.ttl_ms) {
            Some(oldest) if self.ttl_ms > 0 && oldest > 0 => oldest << SEQ_BITS,
            _ => 0,
        }
    }
}

// === impl ApproxTree ===

impl ApproxTree {
    /// An empty tree.
    pub fn new() -> Self {
        let root = TreeNode { live: true, ..TreeNode::default() };
        Self { nodes: vec![root], free: Vec::new(), bytes: 0, live: 0, swept_before: 0 }
    }

    /// Text bytes held.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Bytes held as the bound counts them: the text, and [`NODE_BYTES`] per node.
    pub fn held(&self) -> usize {
        self.bytes + self.live * NODE_BYTES
    }

    /// Records that `text` was sent to `worker` at time `now`, then trims the tree to seven
    /// eighths of `max_bytes` if that took it over (the margin spreads the trims' cost); the
    /// leaves evicted.
    pub fn insert_bounded(&mut self, text: &[u8], worker: WorkerId, now: u64, max_bytes: usize) -> usize {
        self.insert(text, worker, now);
        if self.held() <= max_bytes {
            return 0;
        }
        self.trim(max_bytes - max_bytes / 8)
    }

    /// Records that `text` was sent to `worker` at `stamp` ([`ApproxTreeConfig::stamp`]): first
    /// forgets the placements past `config`'s TTL (when an eighth of it has passed since the
    /// last sweep), then inserts and holds the bound. Returns the leaves evicted by the bound.
    pub fn learn(&mut self, text: &[u8], worker: WorkerId, stamp: u64, config: &ApproxTreeConfig) -> usize {
        let fresh_since = config.fresh_since(stamp >> SEQ_BITS);
        let step = (config.ttl_ms / 8).max(1) << SEQ_BITS;
        if fresh_since > 0 && fresh_since >= self.swept_before.saturating_add(step) {
            self.forget_before(fresh_since);
        }
        self.insert_bounded(text, worker, stamp, config.max_tree_bytes)
    }

    /// Forgets every placement stamped before `stamp`, and the leaves left with none.
    pub fn forget_before(&mut self, stamp: u64) {
        self.swept_before = stamp;
        for n in self.nodes.iter_mut().skip(1) {
            n.workers.retain(|_, used| *used >= stamp);
        }
        self.prune_empty();
    }

    fn alloc(&mut self, node: TreeNode) -> usize {
        self.bytes += node.label.len();
        self.live += 1;
        match self.free.pop() {
            Some(i) => {
                self.nodes[i] = node;
                i
            }
            None => {
                self.nodes.push(node);
                self.nodes.len() - 1
            }
        }
    }

    /// Records that `text` was sent to `worker` at time `now`.
    pub fn insert(&mut self, text: &[u8], worker: WorkerId, now: u64) {
        let mut node = ROOT;
        let mut rest = text;
        self.nodes[ROOT].workers.insert(worker, now);
        while let Some(&first) = rest.first() {
            let Some(&found) = self.nodes[node].children.get(&first) else {
                let leaf = self.alloc(TreeNode {
                    label: rest.to_vec(),
                    parent: node,
                    workers: HashMap::from([(worker, now)]),
                    live: true,
                    ..TreeNode::default()
                });
                self.nodes[node].children.insert(first, leaf);
                return;
            };
            let common = common_prefix(&self.nodes[found].label, rest);
            // A partial match splits the edge; the new upper node is the one on our path.
            let child = if common < self.nodes[found].label.len() { self.split(found, common) } else { found };
            self.nodes[child].workers.insert(worker, now);
            node = child;
            rest = &rest[common..];
        }
    }

    /// Splits `node`'s edge after `at` bytes: a new parent takes the first part. Returns it.
    fn split(&mut self, node: usize, at: usize) -> usize {
        let parent = self.nodes[node].parent;
        let head: Vec<u8> = self.nodes[node].label[..at].to_vec();
        let tail: Vec<u8> = self.nodes[node].label[at..].to_vec();
        let workers = self.nodes[node].workers.clone();
        self.bytes -= self.nodes[node].label.len();
        let mid = self.alloc(TreeNode { label: head.clone(), parent, workers, live: true, ..TreeNode::default() });
        self.bytes += tail.len();
        self.nodes[node].label = tail;
        self.nodes[node].parent = mid;
        let tail_first = self.nodes[node].label[0];
        self.nodes[mid].children.insert(tail_first, node);
        self.nodes[parent].children.insert(head[0], mid);
        mid
    }

    /// The longest prefix of `text` in the tree sent to a worker at `fresh_since` or later
    /// (0: ever), and those workers (in id order). A node's workers were all sent what is
    /// under it, each last no later than at the node: the walk stops at the first node no
    /// fresh worker holds.
    pub fn longest_match(&self, text: &[u8], fresh_since: u64) -> (usize, Vec<WorkerId>) {
        let fresh = |n: usize| self.nodes[n].workers.values().any(|&used| used >= fresh_since);
        let (mut node, mut matched, mut rest) = (ROOT, 0, text);
        let mut best = (0, ROOT);
        while let Some(&first) = rest.first() {
            let Some(&child) = self.nodes[node].children.get(&first) else { break };
            if !fresh(child) {
                break;
            }
            let common = common_prefix(&self.nodes[child].label, rest);
            matched += common;
            node = child;
            best = (matched, node);
            if common < self.nodes[child].label.len() {
                break;
            }
            rest = &rest[common..];
        }
        let (matched, node) = best;
        if node == ROOT {
            return (0, Vec::new());
        }
        let mut workers: Vec<WorkerId> =
            self.nodes[node].workers.iter().filter(|(_, used)| **used >= fresh_since).map(|(w, _)| *w).collect();
        workers.sort_unstable();
        (matched, workers)
    }

    /// Forgets a worker everywhere (it left the fleet).
    pub fn remove_worker(&mut self, worker: WorkerId) {
        for n in &mut self.nodes {
            n.workers.remove(&worker);
        }
        self.prune_empty();
    }

    /// Removes leaves that no worker uses any more.
    fn prune_empty(&mut self) {
        loop {
            let dead: Vec<usize> = (1..self.nodes.len())
                .filter(|&i| {
                    self.nodes[i].live && self.nodes[i].children.is_empty() && self.nodes[i].workers.is_empty()
                })
                .collect();
            if dead.is_empty() {
                return;
            }
            for i in dead {
                self.remove_leaf(i);
            }
        }
    }

    fn remove_leaf(&mut self, i: usize) {
        let parent = self.nodes[i].parent;
        let first = self.nodes[i].label[0];
        self.nodes[parent].children.remove(&first);
        self.bytes -= self.nodes[i].label.len();
        self.live -= 1;
        self.nodes[i] = TreeNode::default();
        self.free.push(i);
    }

    /// Evicts least recently used leaves until the tree holds at most `max_bytes`
    /// ([`held`](Self::held)). Each pass sorts the current leaves by last use once
    /// (O(n log n)); a parent left childless becomes a leaf for the next pass.
    pub fn trim(&mut self, max_bytes: usize) -> usize {
        let mut evicted = 0;
        while self.held() > max_bytes {
            let mut leaves: Vec<(u64, usize)> = (1..self.nodes.len())
                .filter(|&i| self.nodes[i].live && self.nodes[i].children.is_empty())
                .map(|i| (self.nodes[i].workers.values().copied().max().unwrap_or(0), i))
                .collect();
            if leaves.is_empty() {
                break;
            }
            leaves.sort_unstable();
            for (_, leaf) in leaves {
                if self.held() <= max_bytes {
                    break;
                }
                self.remove_leaf(leaf);
                evicted += 1;
            }
        }
        evicted
    }
}

/// How many leading bytes `a` and `b` share: sixteen at a time (a shared system prompt is
/// kilobytes long, and every request walks it twice), then byte by byte.
fn common_prefix(a: &[u8], b: &[u8]) -> usize {
    const W: usize = 16;
    let n = a.len().min(b.len());
    let mut i = 0;
    while i + W <= n {
        let word = |s: &[u8]| u128::from_le_bytes(s[i..i + W].try_into().unwrap_or([0; W]));
        let differ = word(a) ^ word(b);
        if differ != 0 {
            // Little-endian: the first differing byte is the lowest set one.
            return i + (differ.trailing_zeros() / 8) as usize;
        }
        i += W;
    }
    i + a[i..n].iter().zip(&b[i..n]).take_while(|(x, y)| x == y).count()
}

/// The load order with ties to the lowest id, whatever the candidates' order.
fn by_load(c: &&Candidate) -> (u32, u64, WorkerId) {
    (c.load.in_flight, c.load.uncached_tokens, c.worker)
}

// === impl ApproxTreePolicy ===

impl ApproxTreePolicy {
    /// The policy with `config`.
    pub fn new(config: ApproxTreeConfig) -> Self {
        Self { config, tree: Mutex::new(ApproxTree::new()), clock: AtomicU64::new(0) }
    }

    fn tree(&self) -> std::sync::MutexGuard<'_, ApproxTree> {
        self.tree.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Bytes held by the tree, as its bound counts them.
    pub fn tree_bytes(&self) -> usize {
        self.tree().held()
    }
}

impl Policy for ApproxTreePolicy {
    fn name(&self) -> &'static str {
        "approx_tree"
    }

    fn needs_text(&self) -> bool {
        true
    }

    fn select(&self, candidates: &[Candidate], request: &RequestInfo<'_>) -> Result<Decision, PolicyError> {
        check(candidates)?;
        let least = candidates.iter().min_by_key(by_load).ok_or(PolicyError::NoCandidates)?;
        let most = candidates.iter().map(|c| c.load.in_flight).max().unwrap_or(0);
        let min = least.load.in_flight;
        let imbalanced = most.saturating_sub(min) > self.config.balance_abs
            && f64::from(most) > self.config.balance_rel * f64::from(min);
        if imbalanced {
            return Ok(Decision { worker: least.worker, reason: Reason::Imbalanced });
        }
        let text = request.text.unwrap_or("").as_bytes();
        let (matched, holders) = self.tree().longest_match(text, self.config.fresh_since(request.at_ms));
        let ratio = if text.is_empty() { 0.0 } else { matched as f64 / text.len() as f64 };
        let followed = candidates.iter().filter(|c| holders.binary_search(&c.worker).is_ok()).min_by_key(by_load);
        Ok(match followed {
            Some(c) if ratio > self.config.cache_threshold => Decision { worker: c.worker, reason: Reason::TreeMatch },
            _ => Decision { worker: least.worker, reason: Reason::TreeMiss },
        })
    }

    fn commit(&self, decision: &Decision, _candidates: &[Candidate], request: &RequestInfo<'_>) {
        let stamp = ApproxTreeConfig::stamp(request.at_ms, self.clock.fetch_add(1, Ordering::Relaxed));
        let text = request.text.unwrap_or("").as_bytes();
        if !text.is_empty() {
            self.tree().learn(text, decision.worker, stamp, &self.config);
        }
    }

    fn remove_worker(&self, worker: WorkerId) {
        self.tree().remove_worker(worker);
    }

    fn held_bytes(&self) -> usize {
        self.tree_bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Load;

    fn cand(worker: u32, in_flight: u32) -> Candidate {
        Candidate {
            worker: WorkerId(worker),
            load: Load { in_flight, uncached_tokens: 0 },
            matched_tokens: 0,
            followed: false,
            warmup: Default::default(),
            kv_usage: None,
            report: None,
        }
    }

    /// The word-at-a-time comparison agrees with the byte-by-byte one at every length and every
    /// position of the first difference, around the word boundaries.
    #[test]
    fn common_prefix_agrees_with_the_naive_one() {
        let naive = |a: &[u8], b: &[u8]| a.iter().zip(b).take_while(|(x, y)| x == y).count();
        let base: Vec<u8> = (0..100u8).map(|i| i.wrapping_mul(37)).collect();
        for len_a in 0..70 {
            for len_b in [0, 1, 15, 16, 17, 31, 32, 33, 50, 69] {
                for diff in 0..len_a.min(len_b) + 1 {
                    let a = &base[..len_a];
                    let mut b = base[..len_b].to_vec();
                    if diff < b.len() {
                        b[diff] ^= 0x40;
                    }
                    assert_eq!(common_prefix(a, &b), naive(a, &b), "{len_a} {len_b} {diff}");
                }
            }
        }
    }

    fn ask(text: &str) -> RequestInfo<'_> {
        RequestInfo { input_tokens: 0, text: Some(text), at_ms: 0, heads: &[] }
    }

    /// A real request: select, then commit.
    fn send(p: &ApproxTreePolicy, cs: &[Candidate], text: &str) -> Decision {
        let d = p.select(cs, &ask(text)).unwrap();
        p.commit(&d, cs, &ask(text));
        d
    }

    fn ids(ids: &[u32]) -> Vec<WorkerId> {
        ids.iter().copied().map(WorkerId).collect()
    }

    #[test]
    fn tree_splits_and_matches() {
        let mut t = ApproxTree::new();
        t.insert(b"hello world", WorkerId(1), 1);
        t.insert(b"hello there", WorkerId(2), 2);
        assert_eq!(t.longest_match(b"hello world, again", 0), (11, ids(&[1])));
        assert_eq!(t.longest_match(b"hello th", 0), (8, ids(&[2])));
        assert_eq!(t.longest_match(b"help", 0), (3, ids(&[1, 2])));
        assert_eq!(t.longest_match(b"xyz", 0), (0, vec![]));
        assert_eq!(t.bytes(), "hello ".len() + "world".len() + "there".len());
        t.remove_worker(WorkerId(1));
        assert_eq!(t.longest_match(b"hello world", 0), (6, ids(&[2])));
        assert_eq!(t.bytes(), "hello ".len() + "there".len());
    }

    #[test]
    fn trim_drops_least_recently_used_leaves() {
        let mut t = ApproxTree::new();
        t.insert(b"aaaa-old", WorkerId(1), 1);
        t.insert(b"bbbb-new", WorkerId(2), 5);
        assert_eq!(t.held(), 16 + 2 * NODE_BYTES);
        assert_eq!(t.trim(8 + NODE_BYTES), 1);
        assert_eq!(t.longest_match(b"aaaa-old", 0).0, 0);
        assert_eq!(t.longest_match(b"bbbb-new", 0).0, 8);
    }

    #[test]
    fn an_insert_never_leaves_the_tree_over_its_bound() {
        let max = 64 * 1024;
        let mut t = ApproxTree::new();
        let shared = "a long shared system prompt ".repeat(40);
        let mut evicted = 0;
        for i in 0..2_000u64 {
            let text = format!("{shared}{i:08} and a unique question about it");
            evicted += t.insert_bounded(text.as_bytes(), WorkerId((i % 4) as u32), i, max);
            assert!(t.held() <= max, "after insert {i}: {} bytes held over {max}", t.held());
        }
        assert!(evicted > 0, "the bound was reached and kept");
        // The latest prompts and the shared prefix stay; the oldest went.
        let last = format!("{shared}{:08} and a unique question about it", 1_999);
        assert_eq!(t.longest_match(last.as_bytes(), 0).0, last.len());
        let first = format!("{shared}{:08} and a unique question about it", 0);
        assert!(t.longest_match(first.as_bytes(), 0).0 < first.len());
        assert!(t.longest_match(first.as_bytes(), 0).0 >= shared.len());
    }

    #[test]
    fn follows_matches_falls_back_to_load_and_rebalances() {
        let p = ApproxTreePolicy::new(ApproxTreeConfig::default());
        let prompt = "You are a helpful assistant. Question one?";
        let first = send(&p, &[cand(0, 5), cand(1, 0)], prompt);
        assert_eq!(first, Decision { worker: WorkerId(1), reason: Reason::TreeMiss });
        let again = "You are a helpful assistant. Question two?";
        let d = send(&p, &[cand(0, 0), cand(1, 3)], again);
        assert_eq!(d, Decision { worker: WorkerId(1), reason: Reason::TreeMatch }, "the shared prefix wins over load");
        let d = send(&p, &[cand(0, 0), cand(1, 100)], again);
        assert_eq!(d, Decision { worker: WorkerId(0), reason: Reason::Imbalanced });
        let d = send(&p, &[cand(0, 2), cand(1, 1)], "zzz unrelated");
        assert_eq!(d, Decision { worker: WorkerId(1), reason: Reason::TreeMiss });
    }

    #[test]
    fn a_learned_prompt_stays_with_its_worker_id() {
        let p = ApproxTreePolicy::new(ApproxTreeConfig::default());
        let prompt = "You are a helpful assistant. Summarize this report.";
        // Explaining learns nothing: asked twice, still a miss.
        for _ in 0..2 {
            let d = p.select(&[cand(3, 0), cand(7, 1), cand(9, 2)], &ask(prompt)).unwrap();
            assert_eq!(d, Decision { worker: WorkerId(3), reason: Reason::TreeMiss });
        }
        // Sent to 7, the least loaded then.
        let d = send(&p, &[cand(3, 2), cand(7, 0), cand(9, 1)], prompt);
        assert_eq!(d, Decision { worker: WorkerId(7), reason: Reason::TreeMiss });
        // 3 left, and the survivors come in either order: 7 keeps the prompt.
        for cs in [[cand(7, 1), cand(9, 0)], [cand(9, 0), cand(7, 1)]] {
            let d = p.select(&cs, &ask(prompt)).unwrap();
            assert_eq!(d, Decision { worker: WorkerId(7), reason: Reason::TreeMatch }, "{cs:?}");
        }
        // 7 leaves for good: the tree forgets what it was sent (were 7 still
        // offered, the prompt would now go by load).
        p.remove_worker(WorkerId(7));
        assert_eq!(p.tree_bytes(), 0);
        let d = p.select(&[cand(7, 1), cand(9, 0)], &ask(prompt)).unwrap();
        assert_eq!(d, Decision { worker: WorkerId(9), reason: Reason::TreeMiss });
    }

    #[test]
    fn a_placement_past_its_ttl_is_not_matched_and_a_later_commit_forgets_it() {
        let config = ApproxTreeConfig { ttl_ms: 1_000, ..ApproxTreeConfig::default() };
        let stamp = ApproxTreeConfig::stamp;
        let mut t = ApproxTree::new();
        t.learn(b"shared prompt one", WorkerId(1), stamp(1_000, 0), &config);
        t.learn(b"shared prompt two", WorkerId(2), stamp(1_800, 1), &config);
        // At 1,900 ms both are fresh; at 2,500 only worker 2's (1,000 ms is past the TTL):
        // the match stops where no fresh worker was sent the text.
        assert_eq!(t.longest_match(b"shared prompt one", config.fresh_since(1_900)), (17, ids(&[1])));
        assert_eq!(t.longest_match(b"shared prompt one", config.fresh_since(2_500)), (14, ids(&[2])));
        assert_eq!(t.longest_match(b"shared prompt two", config.fresh_since(2_500)), (17, ids(&[2])));
        assert_eq!(t.longest_match(b"shared prompt two", config.fresh_since(2_900)), (0, vec![]));
        // A commit an eighth of the TTL after the last sweep forgets what is past it.
        let before = t.held();
        t.learn(b"x", WorkerId(3), stamp(2_500, 2), &config);
        assert_eq!(t.longest_match(b"shared prompt one", 0), (14, ids(&[2])), "worker 1 forgotten everywhere");
        assert!(t.held() < before, "its leaf pruned: {} against {before}", t.held());
        // Without a TTL nothing ages.
        let forever = ApproxTreeConfig { ttl_ms: 0, ..config };
        assert_eq!(forever.fresh_since(u64::MAX >> SEQ_BITS), 0);
    }

    #[test]
    fn the_policy_ages_its_placements_by_the_requests_time() {
        let p = ApproxTreePolicy::new(ApproxTreeConfig { ttl_ms: 180_000, ..ApproxTreeConfig::default() });
        let prompt = "You are a helpful assistant. Question one?";
        let at = |at_ms| RequestInfo { input_tokens: 0, text: Some(prompt), at_ms, heads: &[] };
        let cs = [cand(0, 0), cand(1, 1)];
        let d = Decision { worker: WorkerId(1), reason: Reason::TreeMiss };
        p.commit(&d, &cs, &at(10_000));
        assert_eq!(p.select(&cs, &at(189_000)).unwrap(), Decision { worker: WorkerId(1), reason: Reason::TreeMatch });
        assert_eq!(p.select(&cs, &at(191_000)).unwrap(), Decision { worker: WorkerId(0), reason: Reason::TreeMiss });
    }
}
