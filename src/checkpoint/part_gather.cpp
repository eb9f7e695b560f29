#include "checkpoint/part_gather.h"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <string>

#include "core/error.h"
#include "dist/comm.h"

namespace lattice {
namespace {

using json = nlohmann::json;

// One message carries at most 2^30 floats (MPI counts are int).
constexpr int64_t kMaxMessage = int64_t(1) << 30;

void send_floats(Comm& c, const float* data, int64_t n, int dst, int tag) {
  for (int64_t i = 0; i < n; i += kMaxMessage) c.send(data + i, std::min(kMaxMessage, n - i), dst, tag);
}
void recv_floats(Comm& c, float* data, int64_t n, int src, int tag) {
  for (int64_t i = 0; i < n; i += kMaxMessage) c.recv(data + i, std::min(kMaxMessage, n - i), src, tag);
}

// The header travels as floats holding exact small integers: its length in 16-bit digits
// [4], then one float per byte of its JSON text.
std::vector<float> encode_header(const std::vector<TensorPart>& parts, const float* flat, int64_t n) {
  json j = {{"n", n}, {"parts", json::array()}};
  for (const TensorPart& p : parts)
    j["parts"].push_back({p.name, p.global_shape, p.offsets, p.lengths, int64_t(p.data - flat)});
  const std::string text = j.dump();
  std::vector<float> out;
  out.reserve(text.size());
  for (unsigned char ch : text) out.push_back(float(ch));
  return out;
}

void send_header(Comm& c, const std::vector<float>& h, int dst, int tag) {
  const uint64_t len = h.size();
  float size[4];
  for (int k = 0; k < 4; ++k) size[k] = float((len >> (16 * k)) & 0xffff);
  c.send(size, 4, dst, tag);
  send_floats(c, h.data(), int64_t(h.size()), dst, tag);
}

// Receives a header from `src`: its parts (data unset), where each lies in the flat buffer
// (*at) and the buffer's size (*n).
std::vector<TensorPart> recv_header(Comm& c, int src, int tag, std::vector<int64_t>* at, int64_t* n) {
  float size[4];
  c.recv(size, 4, src, tag);
  uint64_t len = 0;
  for (int k = 0; k < 4; ++k) len |= uint64_t(size[k]) << (16 * k);
  std::vector<float> h(static_cast<size_t>(len));
  recv_floats(c, h.data(), int64_t(len), src, tag);
  std::string text(static_cast<size_t>(len), '\0');
  for (size_t i = 0; i < text.size(); ++i) text[i] = char(static_cast<unsigned char>(h[i]));
  const json j = json::parse(text);
  *n = j.at("n").get<int64_t>();
  std::vector<TensorPart> parts;
  for (const json& p : j.at("parts")) {
    TensorPart t;
    t.name = p.at(0).get<std::string>();
    t.global_shape = p.at(1).get<std::vector<int64_t>>();
    t.offsets = p.at(2).get<std::vector<int64_t>>();
    t.lengths = p.at(3).get<std::vector<int64_t>>();
    at->push_back(p.at(4).get<int64_t>());
    LATTICE_CHECK(at->back() >= 0 && at->back() + box_numel(t.lengths) <= *n)
        << "checkpoint part " << t.name << " from rank " << src << " lies outside its buffer";
    parts.push_back(std::move(t));
  }
  return parts;
}

}  // namespace

void gather_parts(Comm* comm, const std::vector<int>& contributors, const std::vector<TensorPart>& parts,
                  const float* flat, int64_t n, int tag,
                  const std::function<void(const std::vector<TensorPart>&)>& take) {
  if (!comm || contributors.size() <= 1) {
    if (!comm || contributors.empty() || contributors[0] == comm->rank()) take(parts);
    return;
  }
  const int writer = contributors[0];
  if (comm->rank() != writer) {
    if (std::find(contributors.begin(), contributors.end(), comm->rank()) == contributors.end()) return;
    send_header(*comm, encode_header(parts, flat, n), writer, tag);
    send_floats(*comm, flat, n, writer, tag);
    return;
  }
  take(parts);
  std::vector<float> peer;
  for (size_t k = 1; k < contributors.size(); ++k) {
    int64_t peer_n = 0;
    std::vector<int64_t> at;
    std::vector<TensorPart> received = recv_header(*comm, contributors[k], tag, &at, &peer_n);
    peer.assign(static_cast<size_t>(peer_n), 0.0f);
    recv_floats(*comm, peer.data(), peer_n, contributors[k], tag);
    for (size_t i = 0; i < received.size(); ++i) received[i].data = peer.data() + at[i];
    take(received);
  }
}

}  // namespace lattice
