#include "dtcore/check/item.h"

namespace dtcore::check {

std::string_view status_name(Status status) {
  switch (status) {
    case Status::Pass: return "PASS";
    case Status::Warn: return "WARN";
    case Status::Fail: return "FAIL";
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

}  // namespace dtcore::check
