// Controller replicas sharing their state in etcd, one of them the leader (--store etcd://...).
//
// Keys (under the prefix, default "/ina/controller/"):
//   leader  the leader's advertised "host:port", attached to its lease (TTL `lease_ttl_s`)
//   state   the controller state's JSON (ControllerState::to_json: aggregators, jobs with their
//           placements and keys, refusals)
//
// Election: a replica that finds no leader key grants a lease and creates the key in a txn that
// compares its create revision with 0, so exactly one replica wins; the winner's term is that
// create revision. It renews the lease every `lease_ttl_s / 4`; a leader that stops renewing
// (killed, stopped, cut off) loses the key when the lease runs out, and the next replica to poll
// takes over: a failover takes the TTL plus one poll period at most. A leader that cannot renew
// for the TTL steps down on its own (it no longer knows that it leads).
//
// Writes are fenced: the leader saves the state in a txn that compares the leader key's create
// revision with its own term and the state key's mod revision with the revision it loaded or
// last wrote. A replica that lost the lead, or a state written by anybody else since, fails the
// compare and changes nothing, so two replicas can never both place jobs on the same slots. A
// save that failed its compare reloads: the caller answers "try again" and the next request is
// served from the stored state (admission is sticky by name, so a rank that asks again after a
// failover gets the job the old leader stored, with the same key and placements).
//
// Followers poll the state key and hand each new revision to `apply`, so they answer reads from
// a copy at most one poll period old; writes are forwarded to the leader (server.cc).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "controller/etcd_client.h"
#include "ina/base/status.h"

namespace ina::ctl {

struct ReplicaOptions {
  std::string prefix = "/ina/controller/";
  int64_t lease_ttl_s = 2;         // etcd's smallest lease with its default timing is 2 s
  int64_t poll_ms = 250;           // followers: leader and state poll period
  int64_t etcd_timeout_ms = 1000;  // one etcd call on one endpoint (a call: twice at most)
};

class EtcdReplica {
 public:
  // `text` is the stored state ("" when none is stored yet); `leading` says whether this replica
  // now leads. Called from the replica's thread, with no lock of the replica held.
  using Apply = std::function<Status(const std::string& text, bool leading)>;

  ~EtcdReplica();
  // Parses the endpoints ("etcd://h1:p1,h2:p2") and checks that etcd answers.
  static Result<std::unique_ptr<EtcdReplica>> create(const std::string& spec,
                                                     ReplicaOptions opts = {});
  // Starts campaigning as `self` ("host:port" clients reach this replica at).
  void start(std::string self, Apply apply);
  // Stops the thread; a leader revokes its lease so that another replica takes over at once.
  void stop();

  // Leads now: elected, the state loaded, the lease renewed within its TTL.
  bool leading() const;
  // The leader's "host:port" as last seen ("" while none is known); this replica's own when it
  // leads.
  std::string leader() const;
  std::string describe() const { return etcd_.describe(); }

  // The leader's write (see the file comment): kAborted when the compare failed (not the leader
  // any more, or the state changed), kUnavailable when etcd cannot be reached.
  Status save(const std::string& text);
  // After a failed save: the stored state as it is now (caller applies it); steps down when the
  // leader key is not this replica's any more.
  Result<std::string> reload();
  // Stops serving as the leader (logged with `why`); the lease is kept, so the replica leads again
  // in the same term when it can renew it before it runs out.
  void step_down(const char* why);

 private:
  explicit EtcdReplica(std::vector<EtcdEndpoint> eps, ReplicaOptions opts);
  void loop();
  void step(int64_t now_ms);
  std::string key(const char* k) const { return opts_.prefix + k; }

  ReplicaOptions opts_;
  EtcdClient etcd_;
  std::string self_;
  Apply apply_;
  std::thread thread_;

  mutable std::mutex mu_;  // guards the fields below; never held while calling apply_
  std::condition_variable cv_;
  bool stopping_ = false;
  bool leading_ = false;
  int64_t lease_ = 0;
  int64_t term_ = 0;         // the leader key's create revision while leading
  int64_t state_rev_ = 0;    // the state key's mod revision last loaded or written
  int64_t valid_until_ = 0;  // steady ms: the lease was renewed and holds until then
  std::string leader_;
};

}  // namespace ina::ctl
