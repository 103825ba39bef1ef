// xsim's glue to ns-3 (netmodels/ns3.py), compiled at run time by cppyy, the binding the `ns3` wheel uses.
// Per-packet work stays in C++: a Python callback per received packet would cost more than ns-3 itself.
// What it holds: the receive counter of every flow (a flow is done when its sink has all its bytes; ns-3
// is then stopped so Python issues the next schedule step at that exact instant) and a scheduler that lets
// Python peek at ns-3's next event time (the engine asks the model for its next event; ns-3's public API
// has no such query). Nothing here is copied from ns-3; it uses ns-3's public classes only.
#include <cstdint>
#include <vector>

namespace xsim_ns3 {

// A MapScheduler that remembers itself, so that PeekNext (public in ns3::Scheduler) can be called.
class PeekScheduler : public ns3::MapScheduler {
  public:
    static ns3::TypeId GetTypeId() {
        static ns3::TypeId tid = ns3::TypeId("xsim_ns3::PeekScheduler")
                                     .SetParent<ns3::MapScheduler>()
                                     .SetGroupName("Core")
                                     .AddConstructor<PeekScheduler>();
        return tid;
    }
    PeekScheduler() { Current() = this; }
    ~PeekScheduler() override {
        if (Current() == this) Current() = nullptr;
    }
    static PeekScheduler*& Current() {
        static PeekScheduler* cur = nullptr;
        return cur;
    }
};

// Next event time in ns, -1 when ns-3 has no event left.
inline int64_t NextEventNs() {
    PeekScheduler* s = PeekScheduler::Current();
    if (s == nullptr || s->IsEmpty()) return -1;
    return static_cast<int64_t>(s->PeekNext().key.m_ts);
}

struct Flows {
    uint32_t max_queue = 0;
    uint64_t retransmissions = 0;  // TCP segments the senders sent again (TcpSocketBase's trace)
    uint64_t unwatched = 0;        // senders whose socket could not be hooked (then the count is a floor)
    std::vector<uint64_t> target;
    std::vector<uint64_t> got;
    std::vector<int64_t> done_ns;
    std::vector<int64_t> finished;  // flow ids completed since the last Take()
    // Per flow: the last link's rate (bytes/ns) and how much payload can already be past its serializer.
    std::vector<double> last_rate;
    std::vector<uint64_t> pipe_bytes;
    // Flows still in flight and each flow's place among them: the completion bound scans these only (a
    // training step starts ~10^5 flows; scanning the finished ones made every step O(all flows)).
    std::vector<uint32_t> live;
    std::vector<uint32_t> live_at;
};

inline Flows& State() {
    static Flows f;
    return f;
}

inline void OnRx(uint32_t id, ns3::Ptr<const ns3::Packet> p, const ns3::Address&) {
    Flows& f = State();
    f.got[id] += p->GetSize();
    if (f.got[id] >= f.target[id] && f.done_ns[id] < 0) {
        f.done_ns[id] = ns3::Simulator::Now().GetNanoSeconds();
        f.finished.push_back(id);
        uint32_t at = f.live_at[id];  // swap-remove: the bound takes a minimum, so order does not matter
        f.live[at] = f.live.back();
        f.live_at[f.live[at]] = at;
        f.live.pop_back();
        ns3::Simulator::Stop();  // back to Python at this instant: the next step's sends start here
    }
}

inline void Reset() {
    Flows& f = State();
    f.target.clear();
    f.got.clear();
    f.done_ns.clear();
    f.finished.clear();
    f.last_rate.clear();
    f.pipe_bytes.clear();
    f.live.clear();
    f.live_at.clear();
    f.max_queue = 0;
    f.retransmissions = 0;
    f.unwatched = 0;
}

inline void OnQueue(uint32_t, uint32_t now) {
    Flows& f = State();
    if (now > f.max_queue) f.max_queue = now;
}

inline void WatchQueue(ns3::Ptr<ns3::QueueDisc> q) {
    q->TraceConnectWithoutContext("PacketsInQueue", ns3::MakeCallback(&OnQueue));
}

inline void OnRetransmission(ns3::Ptr<const ns3::Packet>, const ns3::TcpHeader&, const ns3::Address&,
                             const ns3::Address&, ns3::Ptr<const ns3::TcpSocketBase>) {
    State().retransmissions++;
}

inline void HookSender(ns3::Ptr<ns3::Application> app) {
    ns3::Ptr<ns3::BulkSendApplication> bulk = ns3::DynamicCast<ns3::BulkSendApplication>(app);
    ns3::Ptr<ns3::Socket> s = bulk ? bulk->GetSocket() : nullptr;
    if (!s || !s->TraceConnectWithoutContext("Retransmission", ns3::MakeCallback(&OnRetransmission)))
        State().unwatched++;
}

// BulkSend creates its socket when it starts: hook its retransmission trace 1 ns later (no segment can be
// retransmitted within 1 ns of the SYN; the extra event changes no other event's time or order).
inline void WatchSender(ns3::Ptr<ns3::Application> app, int64_t start_ns) {
    ns3::Simulator::Schedule(ns3::NanoSeconds(start_ns + 1), &HookSender, app);
}

inline uint64_t Retransmissions() { return State().retransmissions; }
inline uint64_t Unwatched() { return State().unwatched; }

// RED draws random numbers (its early drops): a fixed stream, like the internet stack's, per queue disc.
inline int64_t AssignQueueStreams(ns3::Ptr<ns3::QueueDisc> q, int64_t stream) {
    ns3::Ptr<ns3::RedQueueDisc> red = ns3::DynamicCast<ns3::RedQueueDisc>(q);
    return red ? red->AssignStreams(stream) : 0;
}

inline uint32_t MaxQueue() { return State().max_queue; }
inline uint32_t FlowCount() { return static_cast<uint32_t>(State().target.size()); }

// Register a flow of `bytes` and hook its sink's Rx trace; returns the flow id.
inline uint32_t AddFlow(ns3::Ptr<ns3::Application> sink, uint64_t bytes, double last_rate,
                        uint64_t pipe_bytes) {
    Flows& f = State();
    uint32_t id = static_cast<uint32_t>(f.target.size());
    f.target.push_back(bytes);
    f.got.push_back(0);
    f.done_ns.push_back(-1);
    f.last_rate.push_back(last_rate);
    f.pipe_bytes.push_back(pipe_bytes);
    f.live_at.push_back(static_cast<uint32_t>(f.live.size()));
    f.live.push_back(id);
    sink->TraceConnectWithoutContext("Rx", ns3::MakeBoundCallback(&OnRx, id));
    return id;
}

// Run ns-3 until `until_ns` (inclusive) or the first flow completion, whichever comes first. The stop event
// sits at until_ns itself, so ns-3's clock never passes it (a flow started then starts exactly then); events
// at until_ns queued behind it run on the next call, at the same instant.
inline void RunUntil(int64_t until_ns) {
    int64_t now = ns3::Simulator::Now().GetNanoSeconds();
    int64_t next = NextEventNs();
    if (next < 0 || next > until_ns || until_ns < now) return;
    ns3::EventId stop = ns3::Simulator::Schedule(ns3::NanoSeconds(until_ns - now), &ns3::Simulator::Stop);
    ns3::Simulator::Run();
    ns3::Simulator::Cancel(stop);
}

// A lower bound on the next flow completion: a flow's payload still missing at its sink must cross the
// sink's last link at most at its rate, except what is already on that link's wire. No completion happens
// before it, so ns-3 may run to it in C++ without Python seeing each event (exact: a completion still stops
// ns-3 at its own instant). -1 when no flow is in flight.
inline int64_t CompletionBoundNs() {
    Flows& f = State();
    int64_t now = ns3::Simulator::Now().GetNanoSeconds();
    double best = -1;
    for (uint32_t i : f.live) {
        uint64_t left = f.target[i] - f.got[i];
        double wait = left > f.pipe_bytes[i] ? double(left - f.pipe_bytes[i]) / f.last_rate[i] : 0.0;
        if (best < 0 || wait < best) best = wait;
    }
    return best < 0 ? -1 : now + static_cast<int64_t>(best);  // floor: stays a lower bound
}

inline std::vector<int64_t> Take() {
    std::vector<int64_t> out;
    out.swap(State().finished);
    return out;
}

inline int64_t DoneNs(uint32_t id) { return State().done_ns[id]; }

}  // namespace xsim_ns3
