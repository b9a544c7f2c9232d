// See replica_etcd.h.
#include "controller/replica_etcd.h"

#include <algorithm>
#include <chrono>

#include "ina/base/log.h"

namespace ina::ctl {
namespace {

constexpr const char* kComponent = "controller";

int64_t steady_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

EtcdReplica::EtcdReplica(std::vector<EtcdEndpoint> eps, ReplicaOptions opts)
    : opts_(std::move(opts)), etcd_(std::move(eps), opts_.etcd_timeout_ms) {}

EtcdReplica::~EtcdReplica() { stop(); }

Result<std::unique_ptr<EtcdReplica>> EtcdReplica::create(const std::string& spec,
                                                         ReplicaOptions opts) {
  INA_ASSIGN_OR_RETURN(std::vector<EtcdEndpoint> eps, parse_etcd_endpoints(spec));
  if (opts.lease_ttl_s < 1) return invalid_argument("leader lease TTL must be >= 1 s");
  if (opts.poll_ms < 10) return invalid_argument("poll period must be >= 10 ms");
  return std::unique_ptr<EtcdReplica>(new EtcdReplica(std::move(eps), std::move(opts)));
}

void EtcdReplica::start(std::string self, Apply apply) {
  self_ = std::move(self);
  apply_ = std::move(apply);
  INA_INFO(kComponent, "replica %s: state in %s under %s, leader lease %lld s", self_.c_str(),
           etcd_.describe().c_str(), opts_.prefix.c_str(),
           static_cast<long long>(opts_.lease_ttl_s));
  thread_ = std::thread([this] { loop(); });
}

void EtcdReplica::stop() {
  {
    std::lock_guard<std::mutex> g(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  int64_t lease = 0;
  bool was_leading = false;
  {
    std::lock_guard<std::mutex> g(mu_);
    lease = lease_;
    was_leading = leading_;
    leading_ = false;
    lease_ = 0;
  }
  // A clean stop hands the lead over at once instead of after the TTL.
  if (lease != 0) {
    (void)etcd_.revoke(lease);
    if (was_leading) INA_INFO(kComponent, "replica %s: stopped leading", self_.c_str());
  }
}

bool EtcdReplica::leading() const {
  std::lock_guard<std::mutex> g(mu_);
  return leading_ && steady_ms() < valid_until_;
}

std::string EtcdReplica::leader() const {
  std::lock_guard<std::mutex> g(mu_);
  return leader_;
}

void EtcdReplica::step_down(const char* why) {
  std::lock_guard<std::mutex> g(mu_);
  if (!leading_) return;
  leading_ = false;
  leader_.clear();
  INA_WARN(kComponent, "replica %s: no longer the leader: %s", self_.c_str(), why);
}

Status EtcdReplica::save(const std::string& text) {
  int64_t term = 0, rev = 0;
  {
    std::lock_guard<std::mutex> g(mu_);
    if (!leading_ || steady_ms() >= valid_until_) return aborted("this replica does not lead");
    term = term_;
    rev = state_rev_;
  }
  Result<EtcdTxnResult> r = etcd_.put_if({{key("leader"), EtcdCompare::Target::kCreate, term},
                                          {key("state"), EtcdCompare::Target::kMod, rev}},
                                         key("state"), text, 0);
  if (!r.ok()) return r.status();
  if (!r->succeeded) {
    return aborted("the state in etcd changed since it was loaded, or this replica lost the lead");
  }
  std::lock_guard<std::mutex> g(mu_);
  state_rev_ = r->revision;
  return ok_status();
}

Result<std::string> EtcdReplica::reload() {
  INA_ASSIGN_OR_RETURN(EtcdKv leader, etcd_.get(key("leader")));
  int64_t term = 0;
  {
    std::lock_guard<std::mutex> g(mu_);
    term = term_;
  }
  if (!leader.found || leader.create_revision != term) step_down("the leader key is not ours");
  INA_ASSIGN_OR_RETURN(EtcdKv state, etcd_.get(key("state")));
  std::lock_guard<std::mutex> g(mu_);
  state_rev_ = state.found ? state.mod_revision : 0;
  return state.found ? state.value : std::string{};
}

void EtcdReplica::loop() {
  const int64_t period = std::min(opts_.poll_ms, opts_.lease_ttl_s * 1000 / 4);
  std::unique_lock<std::mutex> lk(mu_);
  while (!stopping_) {
    lk.unlock();
    step(steady_ms());
    lk.lock();
    cv_.wait_for(lk, std::chrono::milliseconds(period), [this] { return stopping_; });
  }
}

void EtcdReplica::step(int64_t now) {
  bool lead = false;
  int64_t lease = 0;
  {
    std::lock_guard<std::mutex> g(mu_);
    lead = leading_;
    lease = lease_;
  }
  const int64_t ttl_ms = opts_.lease_ttl_s * 1000;
  if (lead) {
    Result<int64_t> t = etcd_.keep_alive(lease);
    if (t.ok() && *t > 0) {
      std::lock_guard<std::mutex> g(mu_);
      valid_until_ = now + std::min(*t * 1000, ttl_ms);
      return;
    }
    if (t.ok()) return step_down("its lease expired");
    bool expired = false;
    {
      std::lock_guard<std::mutex> g(mu_);
      expired = steady_ms() >= valid_until_;
    }
    if (expired) step_down(("cannot renew its lease: " + t.status().message()).c_str());
    return;
  }

  Result<EtcdKv> kv = etcd_.get(key("leader"));
  if (!kv.ok()) return;  // no endpoint answers: try again next period
  if (kv->found && !(kv->value == self_ && lease != 0 && kv->lease == lease)) {
    // Another replica leads: follow the state it writes.
    {
      std::lock_guard<std::mutex> g(mu_);
      if (leader_ != kv->value) {
        INA_INFO(kComponent, "replica %s: following the leader %s", self_.c_str(),
                 kv->value.c_str());
      }
      leader_ = kv->value;
    }
    Result<EtcdKv> st = etcd_.get(key("state"));
    int64_t seen = 0;
    {
      std::lock_guard<std::mutex> g(mu_);
      seen = state_rev_;
    }
    if (st.ok() && st->found && st->mod_revision != seen &&
        apply_(st->value, /*leading=*/false).ok()) {
      std::lock_guard<std::mutex> g(mu_);
      state_rev_ = st->mod_revision;
    }
    return;
  }

  int64_t term = 0;
  int64_t until = now + ttl_ms;
  if (kv->found) {
    // Our own key outlived a step-down (say etcd changed its raft leader while the renewals
    // failed): renew the lease and lead again in the same term.
    Result<int64_t> t = etcd_.keep_alive(lease);
    if (!t.ok() || *t <= 0) return;
    term = kv->create_revision;
    until = now + std::min(*t * 1000, ttl_ms);
  } else {
    // No leader: campaign. The create-revision-0 compare lets exactly one replica win.
    Result<int64_t> granted = etcd_.grant(opts_.lease_ttl_s);
    if (!granted.ok()) return;
    if (lease != 0) (void)etcd_.revoke(lease);
    lease = *granted;
    {
      std::lock_guard<std::mutex> g(mu_);
      lease_ = lease;
    }
    Result<EtcdTxnResult> won = etcd_.put_if({{key("leader"), EtcdCompare::Target::kCreate, 0}},
                                             key("leader"), self_, lease);
    if (!won.ok() || !won->succeeded) return;  // another replica won; follow it next period
    term = won->revision;
  }
  // Leading from here: load the state before serving a write.
  Result<EtcdKv> st = etcd_.get(key("state"));
  Status applied =
      st.ok() ? apply_(st->found ? st->value : std::string{}, /*leading=*/true) : st.status();
  if (!applied.ok()) {
    INA_ERROR(kComponent, "replica %s: elected but cannot load the state from %s: %s",
              self_.c_str(), etcd_.describe().c_str(), applied.message().c_str());
    (void)etcd_.revoke(lease);  // let another replica try
    std::lock_guard<std::mutex> g(mu_);
    lease_ = 0;
    return;
  }
  std::lock_guard<std::mutex> g(mu_);
  leading_ = true;
  term_ = term;
  state_rev_ = st->found ? st->mod_revision : 0;
  valid_until_ = until;
  leader_ = self_;
  INA_INFO(kComponent, "replica %s: leading (term %lld, state revision %lld)", self_.c_str(),
           static_cast<long long>(term), static_cast<long long>(state_rev_));
}

}  // namespace ina::ctl
