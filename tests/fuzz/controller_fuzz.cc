// libFuzzer harness: ina-controller's request parsing (controller/requests.h, called directly,
// not over HTTP) driving ControllerState, and the state file parser (ControllerState::from_json).
//
// Input: text, one command per line, applied in order to one state with a clock that only the
// commands move:
//   hb <json>            a heartbeat body (parse_heartbeat_request, heartbeat, job telemetry)
//   admit <k=v&k=v...>   the query of GET /v1/admit (parse_admit_request, admit, admission_text)
//   release <name> <rank>, remove <id>, drain <id> <0|1>
//   tick <ms>            the clock advances; aggregators and idle jobs expire
//   state <json>         a state file loaded in place of the state (from_json)
// Anything else is skipped; at most 32 lines count.
//
// Invariants: the state always serializes (to_json) and reloads to the same text (the state file
// round-trips: what the controller writes it reads back unchanged; checked after every load and
// at the end); an admission answers
// "admitted" or "refused" first, and asking again with the same name gets the same job; an
// aggregator never has more free slots than its capacity.
#include <cstdint>
#include <string>
#include <string_view>

#include "controller/requests.h"
#include "controller/state.h"
#include "fuzz_check.h"

using namespace ina;
using namespace ina::ctl;

namespace {

std::string_view next_word(std::string_view* s) {
  const size_t sp = s->find(' ');
  const std::string_view w = s->substr(0, sp);
  *s = sp == std::string_view::npos ? std::string_view{} : s->substr(sp + 1);
  return w;
}

QueryParams query(std::string_view q) {
  QueryParams p;
  while (!q.empty()) {
    const size_t amp = q.find('&');
    const std::string_view kv = q.substr(0, amp);
    q = amp == std::string_view::npos ? std::string_view{} : q.substr(amp + 1);
    const size_t eq = kv.find('=');
    p.emplace(std::string(kv.substr(0, eq)),
              eq == std::string_view::npos ? std::string{} : std::string(kv.substr(eq + 1)));
  }
  return p;
}

const StateOptions kOpts{3000, 1, 60000};

struct Keys {
  uint64_t n = 0;
  Key128 operator()() {
    ++n;
    return Key128{n * 0x9E3779B97F4A7C15ull, n};
  }
};

void check_state(const ControllerState& st, Millis now) {
  const std::string text = st.to_json();
  ControllerState again(kOpts, Keys{});
  const Status s = again.from_json(text, now);
  FUZZ_CHECK(s.ok());
  FUZZ_CHECK(again.to_json() == text);
  for (const auto& [id, a] : st.aggregators()) FUZZ_CHECK(st.free_slots(id) <= a.slot_capacity);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  ControllerState st(kOpts, Keys{});
  Millis now = 1000;
  int lines = 0;
  while (!text.empty() && lines++ < 32) {
    const size_t nl = text.find('\n');
    std::string_view line = text.substr(0, nl);
    text = nl == std::string_view::npos ? std::string_view{} : text.substr(nl + 1);
    const std::string_view cmd = next_word(&line);
    if (cmd == "hb") {
      Result<HeartbeatRequest> r = parse_heartbeat_request(std::string(line));
      if (!r.ok()) continue;
      if (!st.heartbeat(r.value().info, now).ok()) continue;
      for (const HeartbeatRequest::JobReport& x : r.value().jobs) {
        st.set_job_telemetry(x.job, r.value().info.id, x.telemetry);
        if (x.has_packets) st.note_job_packets(x.job, r.value().info.id, x.packets, now);
      }
      (void)st.jobs_on(r.value().info.id);
    } else if (cmd == "admit") {
      Result<AdmitRequest> a = parse_admit_request(query(line));
      if (!a.ok()) continue;
      Result<JobInfo> j = st.admit(a.value(), now);
      if (!j.ok()) continue;
      const std::string answer = admission_text(j.value(), a.value().rank, st);
      FUZZ_CHECK(answer.starts_with("admitted\n") || answer.starts_with("refused\n"));
      // The same rank asking again: an admission stands (sticky by name); a refusal is decided
      // again (state.h), and that decision stands in turn.
      Result<JobInfo> again = st.admit(a.value(), now);
      FUZZ_CHECK(again.ok());
      if (j.value().state != JobState::kRefused) {
        FUZZ_CHECK(again.value().id == j.value().id);
      } else if (again.value().state != JobState::kRefused) {
        Result<JobInfo> third = st.admit(a.value(), now);
        FUZZ_CHECK(third.ok() && third.value().id == again.value().id);
      }
    } else if (cmd == "release") {
      const std::string name(next_word(&line));
      uint32_t rank = 0;
      if (parse_u32(std::string(line), &rank)) (void)st.release(name, rank);
    } else if (cmd == "remove") {
      uint32_t id = 0;
      if (parse_u32(std::string(line), &id)) (void)st.remove_job(id);
    } else if (cmd == "drain") {
      const std::string id(next_word(&line));
      (void)st.drain(id, line != "0");
    } else if (cmd == "tick") {
      uint32_t ms = 0;
      if (!parse_u32(std::string(line), &ms)) continue;
      now += ms;
      (void)st.expire(now);
      (void)st.expire_jobs(now);
    } else if (cmd == "state") {
      ControllerState loaded(kOpts, Keys{});
      if (!loaded.from_json(std::string(line), now).ok()) continue;
      st = std::move(loaded);
      check_state(st, now);
    }
  }
  check_state(st, now);
  return 0;
}
