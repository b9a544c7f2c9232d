// Unsigned JSON fields read with a range check. nlohmann's get<uint16_t>() (or any narrower
// integer) converts whatever number it finds: a float out of the type's range is undefined
// behaviour (UBSan: "outside the range of representable values"; fuzz_controller found it in a
// heartbeat's "port"), a larger or negative integer silently wraps. These accept only an unsigned
// integer within the type and otherwise throw nlohmann's type_error, which the callers already
// turn into kInvalidArgument.
#pragma once

#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>

namespace ina::ctl {

template <class T>
T json_unsigned(const nlohmann::json& v, const char* name) {
  static_assert(std::is_unsigned_v<T>);
  if (!v.is_number_unsigned() || v.get<uint64_t>() > std::numeric_limits<T>::max()) {
    throw nlohmann::json::type_error::create(
        302,
        std::string("\"") + name + "\" must be an integer in 0.." +
            std::to_string(std::numeric_limits<T>::max()) + ", got " + v.dump(),
        nullptr);
  }
  return static_cast<T>(v.get<uint64_t>());
}

// The field `name` of object `o` (json::out_of_range when it is missing).
template <class T>
T json_unsigned_at(const nlohmann::json& o, const char* name) {
  return json_unsigned<T>(o.at(name), name);
}

}  // namespace ina::ctl
