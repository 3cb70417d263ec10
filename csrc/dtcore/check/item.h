// Item: one judged line of the resource checker's report, and Items, the list probes append to.
//
// Every probe gathers facts (plain structs, filled from the machine or, in tests, by hand) and a
// judge turns them into Items: PASS, WARN or FAIL, the value seen, a message saying what it means,
// and for WARN/FAIL the fix. Ids are stable ("<group>.<name>", e.g. "host.shm") and documented in
// docs/check.md; tests and the JSON output rely on them. Thread safety: plain values.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace dtcore::check {

enum class Status { Pass, Warn, Fail };

std::string_view status_name(Status status);  // "PASS", "WARN", "FAIL"

struct Item {
  std::string id;     // "<group>.<name>", stable
  std::string title;  // short label for the table, e.g. "/dev/shm"
  Status status = Status::Pass;
  std::string value;    // what was seen, e.g. "64 MiB"
  std::string message;  // what it means
  std::string fix;      // what to do; empty for PASS

  std::string group() const { return id.substr(0, id.find('.')); }
};

class Items {
 public:
  void pass(std::string id, std::string title, std::string value, std::string message = "");
  void warn(std::string id, std::string title, std::string value, std::string message, std::string fix);
  void fail(std::string id, std::string title, std::string value, std::string message, std::string fix);

  const std::vector<Item>& items() const { return items_; }
  std::vector<Item> take() { return std::move(items_); }

 private:
  std::vector<Item> items_;
};

}  // namespace dtcore::check
