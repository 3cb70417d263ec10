// The DTCORE_* registry: knob_value (set, unset, default) and the shape of knobs::kAll.
#include <gtest/gtest.h>

#include <chrono>
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

TEST(KnobDefaults, DurationsAreReadFromTheRegistry) {
  EXPECT_EQ(default_duration(knobs::kTimeout), std::chrono::seconds(300));
  EXPECT_EQ(default_duration(knobs::kRdzvLogInterval), std::chrono::seconds(5));
  EXPECT_THROW(default_duration(knobs::kBackend), std::logic_error);  // "auto" is no number of seconds
}

TEST(UnknownKnobs, AMisspeltNameIsNamedWithTheClosestKnob) {
  const Env env = vars({{"DTCORE_TIMEOUTS", "60"},
                        {"DTCORE_LOGLEVEL", "debug"},
                        {"DTCORE_TIMEOUT", "60"},
                        {"DTCORE_FROBNICATE", "1"},
                        {"NCCL_DEBUG", "INFO"}});
  const std::vector<std::string> lines = unknown_knobs(env);
  ASSERT_EQ(lines.size(), 3u);  // sorted by name; declared knobs and other variables are not named
  EXPECT_EQ(lines[0].rfind("DTCORE_FROBNICATE is set, but dtcore has no such setting and ignores it.", 0), 0u);
  EXPECT_EQ(lines[0].find("Did you mean"), std::string::npos);  // nothing close
  EXPECT_NE(lines[1].find("DTCORE_LOGLEVEL is set"), std::string::npos);
  EXPECT_NE(lines[1].find("Did you mean DTCORE_LOG_LEVEL?"), std::string::npos);
  EXPECT_NE(lines[2].find("Did you mean DTCORE_TIMEOUT?"), std::string::npos);
  EXPECT_NE(lines[2].find("docs/knobs.md"), std::string::npos);
  EXPECT_TRUE(unknown_knobs(vars({{"DTCORE_RANK", "0"}})).empty());
}
