// The etcd client's pure parts: --store endpoint lists and the gateway's base64 (RFC 4648 test
// vectors, and every byte through a round trip). The calls themselves run against a real etcd
// in replicas_test.py.
#include "controller/etcd_client.h"

#include <gtest/gtest.h>

#include <string>

namespace ina::ctl {
namespace {

TEST(EtcdEndpoints, ParsesListsWithAndWithoutScheme) {
  auto r = parse_etcd_endpoints("etcd://h1:2380,10.0.0.2,h3:1");
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  ASSERT_EQ(r->size(), 3u);
  EXPECT_EQ((*r)[0].host, "h1");
  EXPECT_EQ((*r)[0].port, 2380);
  EXPECT_EQ((*r)[1].host, "10.0.0.2");
  EXPECT_EQ((*r)[1].port, 2379);  // etcd's client port by default
  EXPECT_EQ((*r)[2].port, 1);
  r = parse_etcd_endpoints("localhost:2379");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->size(), 1u);
}

TEST(EtcdEndpoints, RejectsBadElementsNamingThem) {
  for (const char* bad :
       {"etcd://", "etcd://h1:2379,", "h1:0", "h1:65536", "h1:x", ":2379", "h1:2379,,h2"}) {
    auto r = parse_etcd_endpoints(bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find("etcd://host:port"), std::string::npos)
        << r.status().message();
  }
}

TEST(Base64, Rfc4648Vectors) {
  const char* plain[] = {"", "f", "fo", "foo", "foob", "fooba", "foobar"};
  const char* coded[] = {"", "Zg==", "Zm8=", "Zm9v", "Zm9vYg==", "Zm9vYmE=", "Zm9vYmFy"};
  for (int i = 0; i < 7; ++i) {
    EXPECT_EQ(base64_encode(plain[i]), coded[i]);
    std::string back;
    ASSERT_TRUE(base64_decode(coded[i], &back)) << coded[i];
    EXPECT_EQ(back, plain[i]);
  }
}

TEST(Base64, EveryByteRoundTrips) {
  std::string all;
  for (int c = 0; c < 256; ++c) all.push_back(static_cast<char>(c));
  for (size_t n = 0; n <= all.size(); n += 37) {
    const std::string in = all.substr(0, n) + all.substr(256 - n % 3);
    std::string out;
    ASSERT_TRUE(base64_decode(base64_encode(in), &out));
    EXPECT_EQ(out, in);
  }
}

TEST(Base64, RejectsMalformedInput) {
  std::string out;
  for (const char* bad : {"Zg=", "Z===", "Zm9v!A==", "Zg==Zg==", "=Zg="}) {
    EXPECT_FALSE(base64_decode(bad, &out)) << bad;
  }
}

}  // namespace
}  // namespace ina::ctl
