#include "tests/worker/mem_network.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>

namespace ina::worker::testing {

class MemNetwork::Endpoint final : public Transport {
 public:
  Endpoint(MemNetwork* net, size_t index) : net_(net), index_(index) {}

  Status send_batch(std::span<const std::span<const uint8_t>> pkts) override {
    for (const auto& p : pkts) {
      if (net_->refuse_) ++net_->refusals_[index_];
      net_->push(net_->to_agg_, index_, p);
    }
    return ok_status();
  }

  Result<size_t> recv_batch(std::span<Datagram> out, std::chrono::microseconds timeout) override {
    Queue& box = *net_->inbox_[index_];
    std::unique_lock<std::mutex> lock(box.m);
    if (!box.cv.wait_for(lock, timeout, [&] { return !box.q.empty(); })) return size_t{0};
    size_t n = 0;
    held_.resize(std::max(held_.size(), out.size()));
    while (n < out.size() && !box.q.empty()) {
      held_[n].swap(box.q.front().bytes);
      box.q.pop_front();
      out[n] = Datagram(held_[n]);
      ++n;
    }
    return n;
  }

  size_t max_datagram() const override { return 65507; }
  std::string peer_name() const override { return "mem-aggregator:1"; }
  uint64_t refusals() const override { return net_->refusals_[index_].load(); }

 private:
  MemNetwork* net_;
  size_t index_;
  std::vector<std::vector<uint8_t>> held_;  // the datagrams handed out by the last call
};

MemNetwork::MemNetwork(size_t endpoints, const agg::JobConfig& job, NetFaults faults, bool alive,
                       bool refuse)
    : faults_(faults), alive_(alive), refuse_(refuse), refusals_(endpoints) {
  rank_endpoint_.assign(job.slots.world_size, -1);
  const Status s = engine_.add_job(job);
  if (!s.ok()) throw std::runtime_error(s.to_string());
  to_agg_.rng.seed(faults.seed);
  for (size_t i = 0; i < endpoints; ++i) {
    inbox_.push_back(std::make_unique<Queue>());
    inbox_.back()->rng.seed(faults.seed * 1000003 + i + 1);
  }
  thread_ = std::thread([this] { aggregator_loop(); });
}

MemNetwork::~MemNetwork() { stop(); }

void MemNetwork::stop() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
}

std::unique_ptr<Transport> MemNetwork::transport(size_t i) {
  return std::make_unique<Endpoint>(this, i);
}

void MemNetwork::push(Queue& box, size_t src, std::span<const uint8_t> bytes) {
  std::lock_guard<std::mutex> lock(box.m);
  std::uniform_real_distribution<double> pct(0.0, 100.0);
  if (faults_.drop_percent > 0 && pct(box.rng) < faults_.drop_percent) {
    ++dropped_;
    return;
  }
  const int copies = faults_.dup_percent > 0 && pct(box.rng) < faults_.dup_percent ? 2 : 1;
  if (copies == 2) ++duplicated_;
  for (int c = 0; c < copies; ++c) {
    Packet p{src, std::vector<uint8_t>(bytes.begin(), bytes.end())};
    if (faults_.reorder_percent > 0 && !box.q.empty() && pct(box.rng) < faults_.reorder_percent) {
      const size_t back = std::min<size_t>(box.q.size(), 8);
      const size_t pos = box.q.size() - 1 - (box.rng() % back);
      box.q.insert(box.q.begin() + static_cast<std::ptrdiff_t>(pos), std::move(p));
      ++reordered_;
    } else {
      box.q.push_back(std::move(p));
    }
  }
  box.cv.notify_one();
}

void MemNetwork::reply(size_t e, std::span<const uint8_t> bytes) {
  if (!alive_) return;
  const uint64_t n = replies_.load() + 1;
  if (kill_at_ != 0 && n >= kill_at_) {
    refuse_ = true;
    alive_ = false;
    return;
  }
  replies_ = n;
  push(*inbox_[e], e, bytes);
}

void MemNetwork::aggregator_loop() {
  std::vector<uint8_t> out;
  while (!stop_) {
    Packet p;
    {
      std::unique_lock<std::mutex> lock(to_agg_.m);
      if (!to_agg_.cv.wait_for(lock, std::chrono::milliseconds(5),
                               [&] { return !to_agg_.q.empty(); })) {
        continue;
      }
      p = std::move(to_agg_.q.front());
      to_agg_.q.pop_front();
    }
    if (!alive_) continue;
    int32_t rank = -1;
    JobId job = 0;
    const agg::Reply r = engine_.on_packet(p.bytes, &rank, &job);
    if (rank >= 0 && static_cast<size_t>(rank) < rank_endpoint_.size()) {
      rank_endpoint_[static_cast<size_t>(rank)] = static_cast<int64_t>(p.src);
    }
    if (r.target == agg::Reply::Target::kNone) continue;
    out.assign(r.packet_size(), 0);
    wire::encode_header(r.hdr, out.data());
    if (r.payload != nullptr)
      std::memcpy(out.data() + wire::kHeaderSize, r.payload, r.payload_bytes());
    wire::seal(out, r.key);  // as the backends seal every reply
    auto send = [&](size_t e) {
      if (faults_.forge_replies) {
        std::vector<uint8_t> forged = out;
        forged.back() ^= 0x01;
        reply(e, forged);
      }
      reply(e, out);
    };
    if (r.target == agg::Reply::Target::kSender) {
      send(p.src);
    } else {
      for (const int64_t e : rank_endpoint_) {
        if (e >= 0) send(static_cast<size_t>(e));
      }
    }
  }
}

}  // namespace ina::worker::testing
