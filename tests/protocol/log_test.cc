// protocol/ logging: each line starts with its UTC time in ISO 8601 with milliseconds, then the
// "[ina <level> <component>] " prefix; the level gates before formatting.
#include "ina/base/log.h"

#include <gtest/gtest.h>

#include <chrono>
#include <regex>
#include <string>

namespace ina::log {
namespace {

TEST(Log, TimestampIsIso8601UtcWithMilliseconds) {
  char out[kTimestampLen + 1];
  EXPECT_EQ(format_timestamp(1796155262345LL, out), kTimestampLen);
  EXPECT_STREQ(out, "2026-12-01T20:01:02.345Z");
  format_timestamp(0, out);
  EXPECT_STREQ(out, "1970-01-01T00:00:00.000Z");
  format_timestamp(-1, out);
  EXPECT_STREQ(out, "1969-12-31T23:59:59.999Z");
}

TEST(Log, LinesStartWithTheTimeThenThePrefix) {
  set_level(Level::kInfo);
  const auto before = std::chrono::system_clock::now();
  ::testing::internal::CaptureStderr();
  INA_ERROR("test", "hello %d", 7);
  INA_DEBUG("test", "not shown");  // below the level
  const std::string err = ::testing::internal::GetCapturedStderr();
  const std::regex line(
      R"(^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z) \[ina error test\] hello 7\n$)");
  std::smatch m;
  ASSERT_TRUE(std::regex_match(err, m, line)) << err;
  // The stamp is now (UTC), to the minute: the one before or the one after the line.
  const auto after = std::chrono::system_clock::now();
  auto minute = [](std::chrono::system_clock::time_point t) {
    char s[kTimestampLen + 1];
    format_timestamp(
        std::chrono::duration_cast<std::chrono::milliseconds>(t.time_since_epoch()).count(), s);
    return std::string(s).substr(0, 16);
  };
  const std::string got = m[1].str().substr(0, 16);
  EXPECT_TRUE(got == minute(before) || got == minute(after)) << err;
}

}  // namespace
}  // namespace ina::log
