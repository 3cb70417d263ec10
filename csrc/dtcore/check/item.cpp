#include "dtcore/check/item.h"

#include <cstdio>

namespace dtcore::check {

std::string_view status_name(Status status) {
  switch (status) {
    case Status::Pass:
      return "PASS";
    case Status::Warn:
      return "WARN";
    case Status::Fail:
      return "FAIL";
  }
  return "?";
}

void Items::pass(std::string id, std::string title, std::string value, std::string message) {
  items_.push_back(Item{std::move(id), std::move(title), Status::Pass, std::move(value), std::move(message), ""});
}

void Items::warn(std::string id, std::string title, std::string value, std::string message, std::string fix) {
  items_.push_back(
      Item{std::move(id), std::move(title), Status::Warn, std::move(value), std::move(message), std::move(fix)});
}

void Items::fail(std::string id, std::string title, std::string value, std::string message, std::string fix) {
  items_.push_back(
      Item{std::move(id), std::move(title), Status::Fail, std::move(value), std::move(message), std::move(fix)});
}

std::string format_bytes(double bytes) {
  static const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  int unit = 0;
  while (bytes >= 1024.0 && unit < 5) {
    bytes /= 1024.0;
    ++unit;
  }
  char buf[32];
  if (unit == 0 || bytes >= 100.0 || bytes == static_cast<double>(static_cast<long long>(bytes))) {
    std::snprintf(buf, sizeof buf, "%.0f %s", bytes, kUnits[unit]);
  } else {
    std::snprintf(buf, sizeof buf, "%.1f %s", bytes, kUnits[unit]);
  }
  return buf;
}

}  // namespace dtcore::check
