// Pure logic of the RDMA verbs transport: peer info serialization, chunking, credit accounting,
// transport selection (see verbs_proto.h). No verbs calls: compiled with or without the feature.
#include "worker/rdma/verbs_proto.h"

#include <algorithm>
#include <string_view>

#include "worker/host/socket.h"

namespace ina::rdma {

namespace {

using host::get_u32;
using host::get_u64;
using host::put_u32;
using host::put_u64;

void put_u16(uint8_t* p, uint16_t v) {
  p[0] = static_cast<uint8_t>(v);
  p[1] = static_cast<uint8_t>(v >> 8);
}
uint16_t get_u16(const uint8_t* p) { return static_cast<uint16_t>(p[0] | (p[1] << 8)); }

// Layout (little-endian): the offsets of every field.
constexpr size_t kOffMagic = 0, kOffVersion = 4, kOffPort = 6, kOffMtu = 7, kOffWorld = 8,
                 kOffFrom = 12, kOffTo = 16, kOffLid = 20, kOffGid = 24, kOffQpn = 40, kOffPsn = 44,
                 kOffSlotsAddr = 48, kOffSlotsRkey = 56, kOffSlotBytes = 60, kOffSlotCount = 64,
                 kOffCreditAddr = 68, kOffCreditRkey = 76, kEnd = 80;
static_assert(kEnd == VerbsPeerInfo::kWireBytes);

Status field_range(const std::string& what, const char* field, uint64_t v, uint64_t lo,
                   uint64_t hi) {
  if (v >= lo && v <= hi) return ok_status();
  return invalid_argument(what + ": " + field + " " + std::to_string(v) + " out of range [" +
                          std::to_string(lo) + ", " + std::to_string(hi) + "]");
}

}  // namespace

bool VerbsPeerInfo::has_gid() const {
  return std::any_of(std::begin(gid), std::end(gid), [](uint8_t b) { return b != 0; });
}

std::vector<uint8_t> VerbsPeerInfo::serialize() const {
  std::vector<uint8_t> b(kWireBytes, 0);
  uint8_t* p = b.data();
  put_u32(p + kOffMagic, kMagic);
  put_u16(p + kOffVersion, kVersion);
  p[kOffPort] = port;
  p[kOffMtu] = mtu;
  put_u32(p + kOffWorld, world_size);
  put_u32(p + kOffFrom, from_rank);
  put_u32(p + kOffTo, to_rank);
  put_u16(p + kOffLid, lid);
  std::copy(std::begin(gid), std::end(gid), p + kOffGid);
  put_u32(p + kOffQpn, qpn);
  put_u32(p + kOffPsn, psn);
  put_u64(p + kOffSlotsAddr, slots_addr);
  put_u32(p + kOffSlotsRkey, slots_rkey);
  put_u32(p + kOffSlotBytes, slot_bytes);
  put_u32(p + kOffSlotCount, slot_count);
  put_u64(p + kOffCreditAddr, credit_addr);
  put_u32(p + kOffCreditRkey, credit_rkey);
  return b;
}

Result<VerbsPeerInfo> VerbsPeerInfo::parse(const std::vector<uint8_t>& bytes,
                                           const std::string& what) {
  if (bytes.size() != kWireBytes)
    return invalid_argument(what + ": " + std::to_string(bytes.size()) + " bytes, expected " +
                            std::to_string(kWireBytes));
  const uint8_t* p = bytes.data();
  if (get_u32(p + kOffMagic) != kMagic)
    return invalid_argument(what + ": bad magic (not INA verbs queue pair info)");
  if (get_u16(p + kOffVersion) != kVersion)
    return invalid_argument(what + ": version " + std::to_string(get_u16(p + kOffVersion)) +
                            ", this rank speaks " + std::to_string(kVersion));
  VerbsPeerInfo v;
  v.port = p[kOffPort];
  v.mtu = p[kOffMtu];
  v.world_size = get_u32(p + kOffWorld);
  v.from_rank = get_u32(p + kOffFrom);
  v.to_rank = get_u32(p + kOffTo);
  v.lid = get_u16(p + kOffLid);
  std::copy(p + kOffGid, p + kOffGid + 16, v.gid);
  v.qpn = get_u32(p + kOffQpn);
  v.psn = get_u32(p + kOffPsn);
  v.slots_addr = get_u64(p + kOffSlotsAddr);
  v.slots_rkey = get_u32(p + kOffSlotsRkey);
  v.slot_bytes = get_u32(p + kOffSlotBytes);
  v.slot_count = get_u32(p + kOffSlotCount);
  v.credit_addr = get_u64(p + kOffCreditAddr);
  v.credit_rkey = get_u32(p + kOffCreditRkey);
  INA_RETURN_IF_ERROR(field_range(what, "world_size", v.world_size, 1, 1u << 20));
  INA_RETURN_IF_ERROR(field_range(what, "from_rank", v.from_rank, 0, v.world_size - 1));
  INA_RETURN_IF_ERROR(field_range(what, "to_rank", v.to_rank, 0, v.world_size - 1));
  if (v.from_rank == v.to_rank)
    return invalid_argument(what + ": from_rank and to_rank are both " +
                            std::to_string(v.from_rank));
  INA_RETURN_IF_ERROR(field_range(what, "port", v.port, 1, 255));
  INA_RETURN_IF_ERROR(field_range(what, "mtu", v.mtu, 1, 5));
  INA_RETURN_IF_ERROR(field_range(what, "qpn", v.qpn, 1, (1u << 24) - 1));
  INA_RETURN_IF_ERROR(field_range(what, "psn", v.psn, 0, (1u << 24) - 1));
  INA_RETURN_IF_ERROR(field_range(what, "slot_bytes", v.slot_bytes, 1, kMaxSlotBytes));
  INA_RETURN_IF_ERROR(field_range(what, "slot_count", v.slot_count, 1, kMaxSlots));
  if (v.lid == 0 && !v.has_gid())
    return invalid_argument(what + ": neither lid nor gid set (one is needed to address the port)");
  if (v.slots_addr == 0) return invalid_argument(what + ": slots_addr is 0");
  if (v.credit_addr == 0 || v.credit_addr % 8 != 0)
    return invalid_argument(what + ": credit_addr " + std::to_string(v.credit_addr) +
                            " is not a non-zero multiple of 8");
  return v;
}

std::string peer_info_key(uint64_t incarnation, int from, int to) {
  return "verbs/" + std::to_string(incarnation) + "/qp/" + std::to_string(from) + "/" +
         std::to_string(to);
}

std::string ready_key(uint64_t incarnation, int rank) {
  return "verbs/" + std::to_string(incarnation) + "/ready/" + std::to_string(rank);
}

size_t chunk_count(size_t bytes, size_t slot_bytes) {
  return bytes == 0 ? 1 : (bytes + slot_bytes - 1) / slot_bytes;
}

size_t chunk_length(size_t bytes, size_t slot_bytes, size_t i) {
  const size_t begin = i * slot_bytes;
  if (begin >= bytes) return 0;
  return std::min(slot_bytes, bytes - begin);
}

uint32_t encode_imm(size_t length, bool last) {
  return static_cast<uint32_t>(length & 0x7FFFFFFFu) | (last ? 0x80000000u : 0u);
}

ChunkImm decode_imm(uint32_t imm) { return {imm & 0x7FFFFFFFu, (imm & 0x80000000u) != 0}; }

Status check_chunk(const ChunkImm& got, size_t bytes, size_t slot_bytes, size_t index,
                   const std::string& peer_name) {
  const size_t n = chunk_count(bytes, slot_bytes);
  const bool last = index + 1 == n;
  if (index < n && got.length == chunk_length(bytes, slot_bytes, index) && got.last == last)
    return ok_status();
  return invalid_argument(peer_name + " sent a message of another size than the " +
                          std::to_string(bytes) + " bytes expected");
}

Status SendWindow::on_local_complete() {
  if (local_done_ >= posted_)
    return internal_error("verbs: a write completed that was never posted");
  ++local_done_;
  return ok_status();
}

Status SendWindow::on_remote_consumed(uint64_t consumed) {
  if (consumed < remote_consumed_ || consumed > posted_)
    return internal_error("credit counter " + std::to_string(consumed) + " outside [" +
                          std::to_string(remote_consumed_) + ", " + std::to_string(posted_) +
                          "] (protocol violation)");
  remote_consumed_ = consumed;
  return ok_status();
}

Status RecvWindow::on_arrival() {
  if (arrived_ - consumed_ >= slots_)
    return internal_error("a chunk arrived with all " + std::to_string(slots_) +
                          " slots full (the sender ignored its credits)");
  ++arrived_;
  return ok_status();
}

namespace {

bool parse_decimal(std::string_view s, uint64_t hi, uint64_t* out) {
  if (s.empty() || s.size() > 6) return false;
  uint64_t v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
    v = v * 10 + static_cast<uint64_t>(c - '0');
  }
  if (v > hi) return false;
  *out = v;
  return true;
}

}  // namespace

Result<VerbsSelection> parse_verbs_selection(const char* device, const char* gid_index) {
  VerbsSelection sel;
  if (device != nullptr && *device != '\0') {
    const std::string_view d(device);
    const size_t colon = d.find(':');
    const std::string_view name = d.substr(0, colon);
    uint64_t port = 0;
    bool ok = !name.empty() && name.find_first_of(" /\t") == std::string_view::npos;
    if (ok && colon != std::string_view::npos)
      ok = parse_decimal(d.substr(colon + 1), 255, &port) && port >= 1;
    if (!ok)
      return invalid_argument("INA_VERBS_DEVICE=\"" + std::string(d) +
                              "\" is not valid: expected an RDMA device name, optionally with "
                              ":port (1 .. 255), e.g. mlx5_0 or mlx5_0:1");
    sel.device = std::string(name);
    sel.port = static_cast<uint8_t>(port);
  }
  if (gid_index != nullptr && *gid_index != '\0') {
    uint64_t g = 0;
    if (!parse_decimal(gid_index, 255, &g))
      return invalid_argument("INA_VERBS_GID_INDEX=\"" + std::string(gid_index) +
                              "\" is not valid: expected an integer in [0, 255]");
    sel.gid_index = static_cast<int>(g);
  }
  return sel;
}

const char* host_transport_name(HostTransport t) {
  switch (t) {
    case HostTransport::kAuto: return "auto";
    case HostTransport::kTcp: return "tcp";
    case HostTransport::kVerbs: return "verbs";
  }
  return "?";
}

Result<HostTransport> choose_host_transport(HostTransport requested, bool rdma_built,
                                            bool rdma_usable, const std::string& rdma_detail) {
  if (requested == HostTransport::kTcp) return HostTransport::kTcp;
  const bool ok = rdma_built && rdma_usable;
  if (requested == HostTransport::kVerbs && !ok)
    return failed_precondition(
        std::string("INA_HOST_TRANSPORT=verbs: RDMA verbs unavailable: ") +
        (rdma_built ? rdma_detail : "libina built without the rdma feature (" + rdma_detail + ")"));
  return ok ? HostTransport::kVerbs : HostTransport::kTcp;
}

std::string encode_vote(const TransportVote& v) {
  return std::string(host_transport_name(v.chosen)) + "/" + host_transport_name(v.requested);
}

Result<TransportVote> decode_vote(const std::string& s, const std::string& what) {
  const size_t slash = s.find('/');
  auto parse = [](std::string_view t, HostTransport* out) {
    if (t == "auto")
      *out = HostTransport::kAuto;
    else if (t == "tcp")
      *out = HostTransport::kTcp;
    else if (t == "verbs")
      *out = HostTransport::kVerbs;
    else
      return false;
    return true;
  };
  TransportVote v;
  if (slash == std::string::npos || !parse(std::string_view(s).substr(0, slash), &v.chosen) ||
      !parse(std::string_view(s).substr(slash + 1), &v.requested) ||
      v.chosen == HostTransport::kAuto)
    return invalid_argument(what + ": \"" + s + "\" is not <tcp|verbs>/<auto|tcp|verbs>");
  return v;
}

Result<HostTransport> agree_host_transport(const std::vector<TransportVote>& votes) {
  if (votes.empty()) return HostTransport::kTcp;
  bool all_same = true;
  for (const TransportVote& v : votes) all_same = all_same && v.chosen == votes[0].chosen;
  if (all_same) return votes[0].chosen;
  int forced_verbs = -1;  // a rank that chose verbs because it was told to
  int tcp = -1;
  for (size_t r = 0; r < votes.size(); ++r) {
    if (votes[r].chosen == HostTransport::kVerbs && votes[r].requested == HostTransport::kVerbs &&
        forced_verbs < 0)
      forced_verbs = static_cast<int>(r);
    if (votes[r].chosen == HostTransport::kTcp && tcp < 0) tcp = static_cast<int>(r);
  }
  if (forced_verbs < 0) return HostTransport::kTcp;  // some rank cannot do verbs: all use tcp
  return failed_precondition("host transport mismatch: rank " + std::to_string(forced_verbs) +
                             " uses verbs (INA_HOST_TRANSPORT=verbs), rank " + std::to_string(tcp) +
                             " tcp (" +
                             host_transport_name(votes[static_cast<size_t>(tcp)].requested) + ")");
}

}  // namespace ina::rdma
