// Helpers for the checker's tests: find a judged item by id and assert on it.
#pragma once

#include <gtest/gtest.h>

#include <initializer_list>
#include <string>

#include "dtcore/check/item.h"

namespace dtcore::check::testing {

// The item with `id`; fails the test (and returns an empty item) when there is none.
inline Item find(const Items& items, const std::string& id) {
  for (const Item& i : items.items()) {
    if (i.id == id) return i;
  }
  std::string have;
  for (const Item& i : items.items()) have += " " + i.id;
  ADD_FAILURE() << "no item " << id << "; have:" << have;
  return Item{};
}

inline bool has(const Items& items, const std::string& id) {
  for (const Item& i : items.items()) {
    if (i.id == id) return true;
  }
  return false;
}

// Status, and each part somewhere in message + fix; a non-PASS item must carry a fix.
inline void expect_item(const Items& items, const std::string& id, Status status,
                        std::initializer_list<const char*> parts = {}) {
  Item i = find(items, id);
  EXPECT_EQ(status_name(i.status), status_name(status)) << id << ": " << i.value << " / " << i.message;
  if (status != Status::Pass) EXPECT_FALSE(i.fix.empty()) << id << " has no fix";
  const std::string text = i.value + " | " + i.message + " | " + i.fix;
  for (const char* part : parts)
    EXPECT_NE(text.find(part), std::string::npos) << id << ": '" << part << "' not in: " << text;
}

}  // namespace dtcore::check::testing
