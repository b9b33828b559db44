//! Maximum flow (Dinic's algorithm) over real capacities, and the lexicographically optimal
//! base of a polymatroid given by a flow network, which the planner uses for its ideals.
//!
//! A network whose last layer is one edge per "item" into the sink defines a polymatroid
//! on the items: an assignment `d` (the sink edges' capacities) is feasible when a maximum
//! flow saturates every sink edge, and the rank of a set of items is the most flow that can
//! reach them. [`lex_optimal_base`] finds the feasible `d` with `d(V)` equal to the rank of
//! all items that is as close to proportional to given weights as the network allows: it
//! raises a common level `d_i = level * w_i`, and freezes items whenever a set of them
//! becomes saturated ("water filling" on a polymatroid, as in Fujishige's decomposition
//! algorithm).

/// A directed graph with edge capacities; edges are stored in pairs (edge, residual).
#[derive(Debug, Clone, Default)]
pub struct FlowGraph {
    /// Per vertex, its outgoing edge ids (including residual ones).
    adjacent: Vec<Vec<usize>>,
    to: Vec<usize>,
    capacity: Vec<f64>,
    flow: Vec<f64>,
}

impl FlowGraph {
    pub fn new(vertices: usize) -> Self {
        FlowGraph {
            adjacent: vec![Vec::new(); vertices],
            ..FlowGraph::default()
        }
    }

    pub fn add_vertex(&mut self) -> usize {
        self.adjacent.push(Vec::new());
        self.adjacent.len() - 1
    }

    /// Adds an edge and returns its id.
    pub fn add_edge(&mut self, from: usize, to: usize, capacity: f64) -> usize {
        let id = self.to.len();
        self.adjacent[from].push(id);
        self.to.push(to);
        self.capacity.push(capacity);
        self.flow.push(0.0);
        self.adjacent[to].push(id + 1);
        self.to.push(from);
        self.capacity.push(0.0);
        self.flow.push(0.0);
        id
    }

    pub fn set_capacity(&mut self, edge: usize, capacity: f64) {
        self.capacity[edge] = capacity;
    }

    fn residual(&self, edge: usize) -> f64 {
        self.capacity[edge] - self.flow[edge]
    }

    /// The maximum flow from `source` to `sink`, from scratch. Residual capacities at or
    /// below `eps` count as none.
    pub fn max_flow(&mut self, source: usize, sink: usize, eps: f64) -> f64 {
        self.flow.iter_mut().for_each(|f| *f = 0.0);
        let vertices = self.adjacent.len();
        let mut total = 0.0;
        loop {
            let level = self.levels(source, eps);
            if level[sink] == usize::MAX {
                return total;
            }
            let mut next = vec![0; vertices];
            loop {
                let pushed = self.push(source, sink, f64::INFINITY, &level, &mut next, eps);
                if pushed <= eps {
                    break;
                }
                total += pushed;
            }
        }
    }

    /// Breadth-first distances from `source` over edges with residual capacity.
    fn levels(&self, source: usize, eps: f64) -> Vec<usize> {
        let mut level = vec![usize::MAX; self.adjacent.len()];
        level[source] = 0;
        let mut queue = std::collections::VecDeque::from([source]);
        while let Some(v) = queue.pop_front() {
            for &e in &self.adjacent[v] {
                let u = self.to[e];
                if level[u] == usize::MAX && self.residual(e) > eps {
                    level[u] = level[v] + 1;
                    queue.push_back(u);
                }
            }
        }
        level
    }

    /// One blocking-flow augmentation along the level graph (iterative depth-first search).
    fn push(
        &mut self,
        source: usize,
        sink: usize,
        limit: f64,
        level: &[usize],
        next: &mut [usize],
        eps: f64,
    ) -> f64 {
        // The path so far, as edge ids.
        let mut path: Vec<usize> = Vec::new();
        let mut v = source;
        loop {
            if v == sink {
                let pushed = path.iter().map(|&e| self.residual(e)).fold(limit, f64::min);
                for &e in &path {
                    self.flow[e] += pushed;
                    self.flow[e ^ 1] -= pushed;
                }
                return pushed;
            }
            let mut advanced = false;
            while next[v] < self.adjacent[v].len() {
                let e = self.adjacent[v][next[v]];
                let u = self.to[e];
                if self.residual(e) > eps && level[u] == level[v] + 1 {
                    path.push(e);
                    v = u;
                    advanced = true;
                    break;
                }
                next[v] += 1;
            }
            if !advanced {
                // Dead end: retreat and skip the edge that led here.
                let Some(e) = path.pop() else {
                    return 0.0;
                };
                v = self.to[e ^ 1];
                next[v] += 1;
            }
        }
    }

    /// Vertices reachable from `source` over edges with residual capacity (after a flow).
    pub fn reachable(&self, source: usize, eps: f64) -> Vec<bool> {
        self.levels(source, eps)
            .into_iter()
            .map(|l| l != usize::MAX)
            .collect()
    }
}

/// A polymatroid as a flow network: `sink_edges[i]` is item `i`'s edge into `sink`.
pub struct Polymatroid {
    pub graph: FlowGraph,
    pub source: usize,
    pub sink: usize,
    pub sink_edges: Vec<usize>,
}

impl Polymatroid {
    /// Builds the network's skeleton: `source`, `sink` and one vertex per item (the caller
    /// adds the edges from the source to the item vertices), returning the item vertices.
    pub fn new(items: usize) -> (Self, Vec<usize>) {
        let mut graph = FlowGraph::new(2);
        let vertices: Vec<usize> = (0..items).map(|_| graph.add_vertex()).collect();
        let sink_edges = vertices
            .iter()
            .map(|&v| graph.add_edge(v, 1, 0.0))
            .collect();
        (
            Polymatroid {
                graph,
                source: 0,
                sink: 1,
                sink_edges,
            },
            vertices,
        )
    }

    /// The most flow the network carries into the items with unlimited sink edges: the
    /// rank of the whole set.
    pub fn rank(&mut self, eps: f64) -> f64 {
        for i in 0..self.sink_edges.len() {
            self.graph.set_capacity(self.sink_edges[i], f64::INFINITY);
        }
        self.graph.max_flow(self.source, self.sink, eps)
    }

    /// Flow with sink capacities `d`; returns the flow and, per item, whether it is on the
    /// source side of the minimum cut found (its sink edge could carry more, or it is cut).
    fn flow_with(&mut self, d: &[f64], eps: f64) -> (f64, Vec<bool>) {
        for (i, &cap) in d.iter().enumerate() {
            self.graph.set_capacity(self.sink_edges[i], cap.max(0.0));
        }
        let flow = self.graph.max_flow(self.source, self.sink, eps);
        let reach = self.graph.reachable(self.source, eps);
        let side = self
            .sink_edges
            .iter()
            .map(|&e| reach[self.graph.to[e ^ 1]])
            .collect();
        (flow, side)
    }
}

/// The lexicographically optimal base of `net`'s polymatroid with respect to `weights`
/// (all positive): as proportional to the weights as the network allows. Items that can
/// take nothing get 0.
pub fn lex_optimal_base(net: &mut Polymatroid, weights: &[f64]) -> Vec<f64> {
    let items = weights.len();
    assert_eq!(items, net.sink_edges.len());
    let rank = net.rank(1e-12);
    // Tolerance for "saturated", relative to the amounts involved.
    let eps = 1e-9 * (1.0 + rank);
    let mut d = vec![0.0; items];
    let mut frozen = vec![false; items];
    let mut rounds = 0;
    while frozen.iter().any(|f| !f) {
        rounds += 1;
        assert!(rounds <= 4 * items + 8, "water filling does not settle");
        let open_weight: f64 = (0..items).filter(|&i| !frozen[i]).map(|i| weights[i]).sum();
        let frozen_sum: f64 = (0..items).filter(|&i| frozen[i]).map(|i| d[i]).sum();
        // The highest level the set of all items allows; lowered to each violated set's
        // level until none is violated (Dinkelbach's iteration: finitely many sets).
        let mut level = ((rank - frozen_sum) / open_weight).max(0.0);
        let at = |level: f64, d: &[f64], frozen: &[bool]| -> Vec<f64> {
            (0..items)
                .map(|i| if frozen[i] { d[i] } else { level * weights[i] })
                .collect()
        };
        let mut iterations = 0;
        let side = loop {
            iterations += 1;
            assert!(iterations <= 4 * items + 8, "level search does not settle");
            let trial = at(level, &d, &frozen);
            let want: f64 = trial.iter().sum();
            let (flow, side) = net.flow_with(&trial, eps);
            if flow >= want - eps {
                break side;
            }
            // The violated set: items on the sink side of the cut. Its rank is the flow
            // minus what reaches the source-side items (their sink edges are cut, full).
            let reached: f64 = (0..items).filter(|&i| side[i]).map(|i| trial[i]).sum();
            let set_rank = flow - reached;
            let set_frozen: f64 = (0..items)
                .filter(|&i| !side[i] && frozen[i])
                .map(|i| d[i])
                .sum();
            let set_weight: f64 = (0..items)
                .filter(|&i| !side[i] && !frozen[i])
                .map(|i| weights[i])
                .sum();
            if set_weight <= 0.0 {
                // Only frozen items violated: rounding noise; the level stands.
                break side;
            }
            let lower = ((set_rank - set_frozen) / set_weight).max(0.0);
            if lower >= level - eps {
                break side;
            }
            level = lower;
        };
        let trial = at(level, &d, &frozen);
        let mut froze_any = false;
        for i in 0..items {
            if frozen[i] {
                continue;
            }
            d[i] = trial[i];
            // An item the source still reaches in the residual network can take more; any
            // other is in a saturated set and stays at this level.
            let grows = side[i];
            if !grows {
                frozen[i] = true;
                froze_any = true;
            }
        }
        if !froze_any {
            // Rounding noise kept everything open: nothing can grow further in practice.
            frozen.iter_mut().for_each(|f| *f = true);
        }
    }
    d
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn max_flow_of_a_small_network() {
        // 0 → 1 (3), 0 → 2 (2), 1 → 2 (1), 1 → 3 (2), 2 → 3 (3): max flow 5.
        let mut g = FlowGraph::new(4);
        g.add_edge(0, 1, 3.0);
        g.add_edge(0, 2, 2.0);
        g.add_edge(1, 2, 1.0);
        g.add_edge(1, 3, 2.0);
        g.add_edge(2, 3, 3.0);
        assert!((g.max_flow(0, 3, 1e-12) - 5.0).abs() < 1e-9);
        let reach = g.reachable(0, 1e-12);
        assert_eq!(reach, vec![true, false, false, false]);
    }

    /// Items 0..3 share one source edge of 6; item 0 alone also caps at 1: the others split
    /// the rest by weight.
    #[test]
    fn water_filling_freezes_a_capped_item_and_shares_the_rest() {
        let (mut net, items) = Polymatroid::new(3);
        let hub = net.graph.add_vertex();
        net.graph.add_edge(net.source, hub, 6.0);
        net.graph.add_edge(hub, items[0], 1.0);
        net.graph.add_edge(hub, items[1], 10.0);
        net.graph.add_edge(hub, items[2], 10.0);
        let d = lex_optimal_base(&mut net, &[4.0, 1.0, 1.0]);
        assert!((d[0] - 1.0).abs() < 1e-6, "{d:?}");
        assert!((d[1] - 2.5).abs() < 1e-6, "{d:?}");
        assert!((d[2] - 2.5).abs() < 1e-6, "{d:?}");
    }

    #[test]
    fn an_unreachable_item_gets_nothing() {
        let (mut net, items) = Polymatroid::new(2);
        net.graph.add_edge(net.source, items[0], 3.0);
        let d = lex_optimal_base(&mut net, &[1.0, 1.0]);
        assert!((d[0] - 3.0).abs() < 1e-6 && d[1].abs() < 1e-6, "{d:?}");
    }
}
