// The DTCORE_* registry: knob_value (set, unset, default) and the shape of knobs::kAll.
#include <gtest/gtest.h>

#include <map>
#include <set>
#include <string>

#include "dtcore/common/env.h"
#include "dtcore/common/knobs.h"

using namespace dtcore;

namespace {
Env vars(std::map<std::string, std::string, std::less<>> v) { return Env(std::move(v)); }
}  // namespace

TEST(KnobValue, ASetVariableIsReturnedAsWritten) {
  Env env = vars({{"DTCORE_TIMEOUT", "60"}, {"DTCORE_RANK", "3"}, {"DTCORE_BACKEND", "Gloo"}});
  EXPECT_EQ(knob_value(env, knobs::kTimeout), "60");
  EXPECT_EQ(knob_value(env, knobs::kRank), "3");
  EXPECT_EQ(knob_value(env, knobs::kBackend), "Gloo");  // parsing (and case folding) is the reader's job
}

TEST(KnobValue, AnUnsetVariableGivesTheDefault) {
  Env env = vars({{"TIMEOUT", "60"}, {"DTCORE_TIMEOUTS", "60"}});  // near misses do not count
  EXPECT_EQ(knob_value(env, knobs::kTimeout), "300");
  EXPECT_EQ(knob_value(env, knobs::kBackend), "auto");
  EXPECT_EQ(knob_value(env, knobs::kLogRanks), "0");
}

TEST(KnobValue, AnUnsetVariableWithAnEmptyDefaultIsNotGiven) {
  EXPECT_EQ(knob_value(Env(), knobs::kRank), std::nullopt);
  EXPECT_EQ(knob_value(Env(), knobs::kLogDir), std::nullopt);
  EXPECT_EQ(knob_value(vars({{"RANK", "2"}}), knobs::kRank), std::nullopt);  // the launcher's variable is not the knob
}

TEST(KnobValue, AVariableSetToTheEmptyStringCountsAsUnset) {
  Env env = vars({{"DTCORE_TIMEOUT", ""}, {"DTCORE_RANK", ""}});
  EXPECT_EQ(knob_value(env, knobs::kTimeout), "300");
  EXPECT_EQ(knob_value(env, knobs::kRank), std::nullopt);
}

TEST(KnobRegistry, NamesAreUniqueAndStartWithDtcore) {
  std::set<std::string_view> names;
  for (const Knob* k : knobs::kAll) {
    ASSERT_NE(k, nullptr);
    EXPECT_TRUE(k->name.starts_with("DTCORE_")) << k->name;
    EXPECT_GT(k->name.size(), std::string_view("DTCORE_").size()) << k->name;
    for (char ch : k->name) EXPECT_TRUE((ch >= 'A' && ch <= 'Z') || ch == '_') << k->name;
    EXPECT_TRUE(names.insert(k->name).second) << k->name << " is declared twice";
  }
  EXPECT_EQ(names.size(), knobs::kAll.size());
}

TEST(KnobRegistry, EveryKnobHasAOneLineDoc) {
  for (const Knob* k : knobs::kAll) {
    EXPECT_FALSE(k->doc.empty()) << k->name;
    EXPECT_EQ(k->doc.find('\n'), std::string_view::npos) << k->name;
  }
}

TEST(KnobRegistry, EveryDeclaredKnobIsListedOnce) {
  std::set<const Knob*> listed(knobs::kAll.begin(), knobs::kAll.end());
  EXPECT_EQ(listed.size(), knobs::kAll.size());
  for (const Knob* k :
       {&knobs::kRank, &knobs::kWorldSize, &knobs::kLocalRank, &knobs::kLocalWorldSize, &knobs::kNodeRank,
        &knobs::kNumNodes, &knobs::kMasterAddr, &knobs::kMasterPort, &knobs::kBackend, &knobs::kTimeout,
        &knobs::kRdzvLogInterval, &knobs::kHeartbeatInterval, &knobs::kJobSecret, &knobs::kJobSecretFile,
        &knobs::kLogLevel, &knobs::kLogRanks, &knobs::kLogDir}) {
    EXPECT_TRUE(listed.count(k)) << k->name << " is not in knobs::kAll";
  }
}
