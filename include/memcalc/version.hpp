#pragma once
/// The library's version; the JSON schema version changes only when a key is removed or renamed.
namespace memcalc {
inline constexpr const char* version = "1.2.0";
inline constexpr int json_schema = 1;
}  // namespace memcalc
