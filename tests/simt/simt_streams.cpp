// The SIMT emulation's streams and events (simt_streams.h): a queue of work per stream,
// run in order when something waits for it.
#include "simt_streams.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace lattice::simt {
namespace {

using Clock = std::chrono::steady_clock;

// A check that an operation's input, [ptr, ptr + bytes), still holds what it read
// (enqueue_check).
struct Check {
  const char* ptr = nullptr;
  size_t bytes = 0;
  std::function<void()> verify;
};

// One queued operation: work to run, a check, or a wait until another stream has run
// `until` operations (a cudaStreamWaitEvent, on the event's recording at the time of the
// call).
struct Item {
  std::function<void()> work;
  std::shared_ptr<Check> check;
  uint64_t wait_stream = 0;
  uint64_t until = 0;
};

struct Stream {
  uint64_t id = 0;
  std::deque<Item> pending;
  uint64_t enqueued = 0, done = 0;  // operations so far; the first `done` have run
  bool running = false;             // one of its operations is running
  // Checks passed over by drain_for_operation, by position: not yet known complete.
  std::vector<std::pair<uint64_t, std::shared_ptr<Check>>> outstanding;
};

// What an event recorded: a stream's position, and the time its work got there. Shared
// with the queued item that takes the time, so an event destroyed before its work has run
// (as CUDA allows) is not written after it is freed.
struct Recording {
  uint64_t stream = 0, position = 0;
  Clock::time_point at{};
  bool reported_not_ready = false;
};
struct Event {
  std::shared_ptr<Recording> last;  // null until recorded
};

struct Registry {
  std::recursive_mutex mutex;
  std::map<uint64_t, Stream*> streams;  // live streams by id (ascending: creation order)
  uint64_t next_id = 1;
  Stream default_stream;  // id 0: the stream of cudaStream_t nullptr
  Registry() { streams[0] = &default_stream; }
};
Registry& registry() {
  static Registry r;
  return r;
}

Stream* stream_of(cudaStream_t s) {
  return s ? reinterpret_cast<Stream*>(s) : &registry().default_stream;
}

StreamOrder order_from_environment() {
  const char* v = std::getenv("LATTICE_SIMT_STREAMS");
  const std::string mode = v ? v : "";
  if (mode.empty() || mode == "reads-early") return StreamOrder::reads_early;
  if (mode == "writes-early") return StreamOrder::writes_early;
  if (mode == "sync") return StreamOrder::sync;
  std::fprintf(stderr, "SIMT emulation: LATTICE_SIMT_STREAMS=%s: expected reads-early, writes-early or sync\n",
               mode.c_str());
  std::exit(2);
}
StreamOrder& order() {
  static StreamOrder o = order_from_environment();
  return o;
}

// Runs the outstanding checks the predicate selects.
template <typename Select>
void verify_outstanding(Stream& s, Select select) {
  auto& o = s.outstanding;
  for (auto it = o.begin(); it != o.end();) {
    if (select(it->first, *it->second)) {
      it->second->verify();
      it = o.erase(it);
    } else {
      ++it;
    }
  }
}

// Runs the stream's work until `until` operations have run. A stream is only ever waited
// for up to positions recorded before the wait was enqueued, so the recursion ends.
// `observed`: whoever asks learns that the work up to `until` is complete (a
// synchronization, an event waited for), so the input checks up to there are due;
// otherwise (an NCCL operation about to read what its stream makes) they stay outstanding.
void run_until(uint64_t id, uint64_t until, bool observed = true) {
  Registry& r = registry();
  auto it = r.streams.find(id);
  if (it == r.streams.end()) return;  // destroyed: its work has run
  Stream& s = *it->second;
  if (s.done >= until) {
    if (observed) verify_outstanding(s, [until](uint64_t pos, const Check&) { return pos <= until; });
    return;
  }
  if (s.running) {
    std::fprintf(stderr, "SIMT emulation: streams wait on each other in a cycle (stream %llu)\n",
                 static_cast<unsigned long long>(id));
    std::abort();
  }
  if (order() == StreamOrder::writes_early) {
    // What the stream waits for anywhere before `until` first: on a GPU the other streams'
    // work may well run before this stream's earlier work.
    for (uint64_t pos = s.done; pos < until; ++pos) {
      if (pos < s.done) continue;  // run meanwhile (a stream waited for waits on this one)
      const Item& item = s.pending[size_t(pos - s.done)];
      if (!item.work && !item.check) run_until(item.wait_stream, item.until);
    }
  }
  while (s.done < until) {
    Item item = std::move(s.pending.front());
    s.pending.pop_front();
    s.running = true;
    if (item.work) item.work();
    else if (item.check) s.outstanding.emplace_back(s.done + 1, std::move(item.check));
    else run_until(item.wait_stream, item.until);
    s.running = false;
    ++s.done;
  }
  if (observed) verify_outstanding(s, [until](uint64_t pos, const Check&) { return pos <= until; });
}

void push(Stream& s, Item item) {
  s.pending.push_back(std::move(item));
  ++s.enqueued;
  if (order() == StreamOrder::sync) run_until(s.id, s.enqueued);
}

bool complete(const Recording& rec) {
  Registry& r = registry();
  auto it = r.streams.find(rec.stream);
  return it == r.streams.end() || it->second->done >= rec.position;
}

}  // namespace

StreamOrder stream_order() { return order(); }
void set_stream_order(StreamOrder o) {
  drain_all();
  order() = o;
}

void enqueue(cudaStream_t stream, std::function<void()> work) {
  std::lock_guard lock(registry().mutex);
  Item item;
  item.work = std::move(work);
  push(*stream_of(stream), std::move(item));
}

void drain(cudaStream_t stream) {
  std::lock_guard lock(registry().mutex);
  Stream& s = *stream_of(stream);
  run_until(s.id, s.enqueued);
}

void drain_for_operation(cudaStream_t stream) {
  std::lock_guard lock(registry().mutex);
  Stream& s = *stream_of(stream);
  run_until(s.id, s.enqueued, /*observed=*/false);
}

void enqueue_check(cudaStream_t stream, const void* ptr, size_t bytes, std::function<void()> verify) {
  std::lock_guard lock(registry().mutex);
  Item item;
  item.check = std::make_shared<Check>(Check{static_cast<const char*>(ptr), bytes, std::move(verify)});
  push(*stream_of(stream), std::move(item));
}

void verify_checks_before_write(cudaStream_t stream, const void* dst, size_t bytes) {
  std::lock_guard lock(registry().mutex);
  const char* begin = static_cast<const char*>(dst);
  verify_outstanding(*stream_of(stream), [begin, bytes](uint64_t, const Check& c) {
    return begin < c.ptr + c.bytes && c.ptr < begin + bytes;
  });
}

void drain_all() {
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  std::vector<std::pair<uint64_t, uint64_t>> ends;
  for (auto& [id, s] : r.streams) ends.emplace_back(id, s->enqueued);
  for (auto [id, end] : ends) run_until(id, end);
}

cudaStream_t create_stream() {
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  auto* s = new Stream;
  s->id = r.next_id++;
  r.streams[s->id] = s;
  return reinterpret_cast<cudaStream_t>(s);
}

void destroy_stream(cudaStream_t stream) {
  if (!stream) return;
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  Stream* s = stream_of(stream);
  run_until(s->id, s->enqueued);
  r.streams.erase(s->id);
  delete s;
}

cudaEvent_t create_event() { return reinterpret_cast<cudaEvent_t>(new Event); }
void destroy_event(cudaEvent_t event) { delete reinterpret_cast<Event*>(event); }

void record_event(cudaEvent_t event, cudaStream_t stream) {
  std::lock_guard lock(registry().mutex);
  Stream& s = *stream_of(stream);
  auto rec = std::make_shared<Recording>();
  rec->stream = s.id;
  rec->position = s.enqueued + 1;
  reinterpret_cast<Event*>(event)->last = rec;
  Item stamp;
  stamp.work = [rec] { rec->at = Clock::now(); };
  push(s, std::move(stamp));
}

void wait_event(cudaStream_t stream, cudaEvent_t event) {
  std::lock_guard lock(registry().mutex);
  const auto& rec = reinterpret_cast<Event*>(event)->last;
  if (!rec) return;  // CUDA: waiting on an unrecorded event is a no-op
  // Queued even when the work has run: reaching it makes the input checks up to the
  // event due (an NCCL operation's, passed over when the next one read its input).
  Item wait;
  wait.wait_stream = rec->stream;
  wait.until = rec->position;
  push(*stream_of(stream), std::move(wait));
}

bool query_event(cudaEvent_t event) {
  std::lock_guard lock(registry().mutex);
  const auto& rec = reinterpret_cast<Event*>(event)->last;
  if (!rec) return true;
  if (complete(*rec)) {
    run_until(rec->stream, rec->position);  // the input checks up to the event are due
    return true;
  }
  if (!rec->reported_not_ready) {
    rec->reported_not_ready = true;
    return false;
  }
  run_until(rec->stream, rec->position);
  return true;
}

void synchronize_event(cudaEvent_t event) {
  std::lock_guard lock(registry().mutex);
  const auto& rec = reinterpret_cast<Event*>(event)->last;
  if (rec) run_until(rec->stream, rec->position);
}

bool event_completed(cudaEvent_t event) {
  std::lock_guard lock(registry().mutex);
  const auto& rec = reinterpret_cast<Event*>(event)->last;
  return !rec || complete(*rec);
}

float elapsed_ms(cudaEvent_t start, cudaEvent_t stop) {
  const auto& a = reinterpret_cast<Event*>(start)->last;
  const auto& b = reinterpret_cast<Event*>(stop)->last;
  if (!a || !b) return 0.0f;
  return std::chrono::duration<float, std::milli>(b->at - a->at).count();
}

}  // namespace lattice::simt
