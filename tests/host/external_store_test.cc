// ina_comm_create_with_store (and Config::external_store): the host mesh meets through the
// application's store instead of libina's TcpStore. Threads as ranks through the C ABI, an
// in-memory store behind the ina_store_t callbacks; the keys libina wrote are checked, so is a
// rank whose peer never publishes (an INA_TIMEOUT naming the key) and a store with a missing
// callback.
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "ina/ina.h"

namespace {

// A thread-safe key/value map with waiting gets: what a launcher's store offers.
struct MemStore {
  std::mutex mu;
  std::condition_variable cv;
  std::map<std::string, std::vector<uint8_t>> kv;
  int sets = 0;
  int gets = 0;

  static ina_result_t set(void* ctx, const char* key, const void* value, size_t size) {
    auto* s = static_cast<MemStore*>(ctx);
    std::lock_guard<std::mutex> lock(s->mu);
    const auto* p = static_cast<const uint8_t*>(value);
    s->kv[key] = std::vector<uint8_t>(p, p + size);
    ++s->sets;
    s->cv.notify_all();
    return INA_SUCCESS;
  }

  static ina_result_t get(void* ctx, const char* key, uint32_t timeout_ms, void* value,
                          size_t capacity, size_t* size) {
    auto* s = static_cast<MemStore*>(ctx);
    std::unique_lock<std::mutex> lock(s->mu);
    ++s->gets;
    if (!s->cv.wait_for(lock, std::chrono::milliseconds(timeout_ms),
                        [&] { return s->kv.count(key) != 0; })) {
      return INA_TIMEOUT;
    }
    const auto& v = s->kv[key];
    *size = v.size();
    if (v.size() <= capacity) std::memcpy(value, v.data(), v.size());
    return INA_SUCCESS;
  }

  ina_store_t c_store() { return ina_store_t{this, &MemStore::set, &MemStore::get}; }
};

class ExternalStore : public ::testing::Test {
 protected:
  void SetUp() override {
    // Neither an aggregator nor libina's own store: only the external store can connect ranks.
    for (const char* v : {"INA_AGGREGATOR", "INA_STORE", "MASTER_ADDR", "MASTER_PORT",
                          "INA_TRANSPORT", "INA_RANK", "INA_WORLD_SIZE"}) {
      unsetenv(v);
    }
  }
};

TEST_F(ExternalStore, ThreeRanksMeetAndReduceOnTheHostMesh) {
  constexpr int kWorld = 3;
  constexpr size_t kCount = 1000;
  MemStore store;
  const ina_store_t cs = store.c_store();
  std::vector<std::vector<float>> out(kWorld, std::vector<float>(kCount));
  std::vector<std::vector<int32_t>> gathered(kWorld, std::vector<int32_t>(kWorld));
  std::vector<ina_result_t> rc(kWorld, INA_INTERNAL_ERROR);
  std::vector<std::string> err(kWorld);
  std::vector<int> on_host(kWorld, -1);
  std::vector<std::thread> ranks;
  for (int r = 0; r < kWorld; ++r) {
    ranks.emplace_back([&, r] {
      ina_config_t cfg = INA_CONFIG_INITIALIZER;
      cfg.rank = r;
      cfg.world_size = kWorld;
      cfg.job = 9;
      cfg.timeout_ms = 10000;
      ina_comm_t* comm = nullptr;
      rc[r] = ina_comm_create_with_store(&cfg, &cs, &comm);
      if (rc[r] != INA_SUCCESS) {
        err[r] = ina_last_create_error();
        return;
      }
      on_host[r] = ina_comm_on_host_path(comm);
      std::vector<float> in(kCount);
      for (size_t i = 0; i < kCount; ++i) in[i] = static_cast<float>(r + 1) * 0.5f + i;
      rc[r] = ina_allreduce(comm, in.data(), out[r].data(), kCount, INA_FLOAT32, INA_SUM);
      int32_t mine = 100 + r;
      if (rc[r] == INA_SUCCESS) {
        rc[r] = ina_allgather(comm, &mine, gathered[r].data(), 1, INA_INT32);
      }
      if (rc[r] != INA_SUCCESS) err[r] = ina_comm_last_error(comm);
      ina_comm_destroy(comm);
    });
  }
  for (auto& t : ranks) t.join();
  for (int r = 0; r < kWorld; ++r) {
    ASSERT_EQ(rc[r], INA_SUCCESS) << "rank " << r << ": " << err[r];
    EXPECT_EQ(on_host[r], 1) << "no aggregator named: the host mesh only";
    for (size_t i = 0; i < kCount; ++i) {
      // (0.5 + 1 + 1.5) + 3 i: exact in float32.
      ASSERT_EQ(out[r][i], 3.0f + 3.0f * static_cast<float>(i)) << "rank " << r << " elem " << i;
    }
    EXPECT_EQ(gathered[r], (std::vector<int32_t>{100, 101, 102}));
  }
  // Every rank published its host-transport vote and its mesh address under the job's prefix,
  // through this store only, and nothing else.
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_EQ(store.kv.count("ina/job9/transport/" + std::to_string(r)), 1u) << r;
    EXPECT_EQ(store.kv.count("ina/job9/mesh/addr/" + std::to_string(r)), 1u) << r;
  }
  EXPECT_EQ(store.sets, 2 * kWorld);
}

TEST_F(ExternalStore, MissingPeerIsATimeoutNamingItsKey) {
  MemStore store;
  const ina_store_t cs = store.c_store();
  ina_config_t cfg = INA_CONFIG_INITIALIZER;
  cfg.rank = 1;
  cfg.world_size = 2;
  cfg.timeout_ms = 300;
  ina_comm_t* comm = nullptr;
  EXPECT_EQ(ina_comm_create_with_store(&cfg, &cs, &comm), INA_TIMEOUT);
  EXPECT_EQ(comm, nullptr);
  // Rank 0 never published anything: the first key rank 1 waits for (its host-transport vote)
  // is named.
  EXPECT_NE(std::string(ina_last_create_error()).find("ina/job1/transport/0"), std::string::npos)
      << ina_last_create_error();
}

TEST_F(ExternalStore, MissingCallbackOrStoreIsAnInvalidArgument) {
  MemStore store;
  ina_store_t cs = store.c_store();
  cs.get = nullptr;
  ina_config_t cfg = INA_CONFIG_INITIALIZER;
  cfg.rank = 0;
  cfg.world_size = 1;
  ina_comm_t* comm = nullptr;
  EXPECT_EQ(ina_comm_create_with_store(&cfg, &cs, &comm), INA_INVALID_ARGUMENT);
  EXPECT_NE(std::string(ina_last_create_error()).find("store->get"), std::string::npos)
      << ina_last_create_error();
  EXPECT_EQ(ina_comm_create_with_store(&cfg, nullptr, &comm), INA_INVALID_ARGUMENT);
  EXPECT_NE(std::string(ina_last_create_error()).find("store is NULL"), std::string::npos);
  EXPECT_EQ(store.sets, 0);
}

}  // namespace
