// read_settings: precedence (init() argument > DTCORE_* > default), sources, bad values, log ranks, log_config.
#include <gtest/gtest.h>

#include <limits>
#include <map>
#include <stdexcept>

#include "dtcore/common/error.h"
#include "dtcore/common/settings.h"
#include "expect_error.h"

using namespace dtcore;
using dtcore::testing::error_of;
using dtcore::testing::expect_contains;

namespace {

Env vars(std::map<std::string, std::string, std::less<>> v) { return Env(std::move(v)); }

// The ConfigError read_settings raises for `env` and `args`.
std::string refusal(const Env& env, const Arguments& args = {}) {
  return error_of<ConfigError>([&] { read_settings(env, args); });
}

LogRanks ranks_of(const std::string& text) { return read_settings(vars({{"DTCORE_LOG_RANKS", text}})).log_ranks.value; }

}  // namespace

TEST(Settings, DefaultsComeFromTheKnobRegistry) {
  Settings s = read_settings(Env());
  EXPECT_EQ(s.timeout_s.value, 300.0);
  EXPECT_EQ(s.backend.value, "auto");
  EXPECT_EQ(s.log_level.value, log::Level::Info);
  EXPECT_EQ(s.log_ranks.value.to_string(), "0");
  EXPECT_EQ(s.log_dir.value, "");
  EXPECT_EQ(s.rdzv_log_interval_s.value, 5.0);
  EXPECT_EQ(s.heartbeat_interval_s.value, 1.0);
  for (const auto* source : {&s.timeout_s.source, &s.backend.source, &s.log_level.source, &s.log_dir.source}) {
    EXPECT_EQ(*source, "default");
  }
}

TEST(Settings, AnArgumentBeatsTheVariableWhichBeatsTheDefault) {
  Env env = vars({{"DTCORE_TIMEOUT", "60"}, {"DTCORE_LOG_DIR", "/from/env"}, {"DTCORE_BACKEND", "gloo"}});
  Settings from_env = read_settings(env);
  EXPECT_EQ(from_env.timeout_s.value, 60.0);
  EXPECT_EQ(from_env.timeout_s.source, "DTCORE_TIMEOUT");
  EXPECT_EQ(from_env.log_dir.value, "/from/env");
  EXPECT_EQ(from_env.log_dir.source, "DTCORE_LOG_DIR");

  Settings from_args = read_settings(env, {{"timeout", Argument{int64_t{30}}},
                                           {"log_dir", Argument{std::string("/from/arg")}},
                                           {"backend", Argument{std::string("nccl")}}});
  EXPECT_EQ(from_args.timeout_s.value, 30.0);
  EXPECT_EQ(from_args.timeout_s.source, "init(timeout=)");
  EXPECT_EQ(from_args.log_dir.value, "/from/arg");
  EXPECT_EQ(from_args.log_dir.source, "init(log_dir=)");
  EXPECT_EQ(from_args.backend.value, "nccl");
  EXPECT_EQ(from_args.backend.source, "init(backend=)");

  Settings none = read_settings(env, {{"timeout", std::nullopt}, {"log_dir", std::nullopt}});  // None: not given
  EXPECT_EQ(none.timeout_s.source, "DTCORE_TIMEOUT");
  EXPECT_EQ(none.log_dir.source, "DTCORE_LOG_DIR");
  EXPECT_EQ(read_settings(Env(), {{"timeout", Argument{2.5}}}).timeout_s.value, 2.5);
}

TEST(Settings, BackendAutoAsAnArgumentDefersToTheVariable) {
  Arguments args{{"backend", Argument{std::string("auto")}}};
  Settings s = read_settings(vars({{"DTCORE_BACKEND", "gloo"}}), args);
  EXPECT_EQ(s.backend.value, "gloo");
  EXPECT_EQ(s.backend.source, "DTCORE_BACKEND");
  Settings d = read_settings(Env(), args);
  EXPECT_EQ(d.backend.value, "auto");
  EXPECT_EQ(d.backend.source, "default");
}

TEST(Settings, WordsAreCaseFolded) {
  Settings s = read_settings(vars({{"DTCORE_BACKEND", "NCCL"}, {"DTCORE_LOG_LEVEL", "Warning"}}));
  EXPECT_EQ(s.backend.value, "nccl");
  EXPECT_EQ(s.log_level.value, log::Level::Warn);
  EXPECT_EQ(read_settings(Env(), {{"backend", Argument{std::string("Gloo")}}}).backend.value, "gloo");
}

TEST(Settings, OneBadValueIsOneConfigErrorWithItsFix) {
  std::string m = refusal(vars({{"DTCORE_TIMEOUT", "abc"}}));
  EXPECT_EQ(m.find("not valid:"), std::string::npos) << m;  // no list for a single problem
  expect_contains(m, {"DTCORE_TIMEOUT='abc' is not a positive number of seconds", "Fix:"});
  expect_contains(refusal(vars({{"DTCORE_BACKEND", "yes"}})), {"DTCORE_BACKEND='yes'", "auto, nccl, gloo"});
  expect_contains(refusal(Env(), {{"timeout", Argument{int64_t{0}}}}),
                  {"init(timeout=0) is not a positive number of seconds"});
  expect_contains(refusal(Env(), {{"timeout", Argument{-1.5}}}), {"init(timeout=-1.5)"});
  expect_contains(refusal(Env(), {{"backend", Argument{std::string("mpi")}}}),
                  {"init(backend='mpi') is not a backend", "auto, nccl, gloo"});
  for (const char* t : {"-5", "0", "inf", "nan", "5s", "1e400"}) {
    expect_contains(refusal(vars({{"DTCORE_HEARTBEAT_INTERVAL", t}})), {"DTCORE_HEARTBEAT_INTERVAL='", t});
  }
}

TEST(Settings, EveryBadValueIsListedInOneConfigError) {
  std::string m = refusal(vars({{"DTCORE_TIMEOUT", "abc"},
                                {"DTCORE_BACKEND", "mpi"},
                                {"DTCORE_LOG_LEVEL", "loud"},
                                {"DTCORE_LOG_RANKS", "x"},
                                {"DTCORE_RDZV_LOG_INTERVAL", "-1"}}));
  expect_contains(m, {"dtcore's settings are not valid:", "DTCORE_TIMEOUT='abc'",
                      "DTCORE_BACKEND='mpi' is not a backend", "DTCORE_LOG_LEVEL='loud' is not a log level",
                      "DTCORE_LOG_RANKS='x' is not a list of ranks", "DTCORE_RDZV_LOG_INTERVAL='-1'"});
  size_t fixes = 0;
  for (size_t at = m.find("Fix:"); at != std::string::npos; at = m.find("Fix:", at + 1)) ++fixes;
  EXPECT_EQ(fixes, 5u) << m;
}

TEST(Settings, WithAProblemsListBadValuesAreAppendedAndDefaultsUsed) {
  std::vector<Problem> problems{Problem{"earlier", "X", "1", "kept", "keep it"}};
  Settings s = read_settings(vars({{"DTCORE_TIMEOUT", "abc"}, {"DTCORE_BACKEND", "mpi"}, {"DTCORE_LOG_DIR", "/d"}}), {},
                             &problems);
  ASSERT_EQ(problems.size(), 3u);
  EXPECT_EQ(problems[0].field, "earlier");
  const Problem& t = problems[1];
  EXPECT_EQ(t.field, "timeout");
  EXPECT_EQ(t.variable, "DTCORE_TIMEOUT");
  EXPECT_EQ(t.value, "abc");
  EXPECT_NE(t.message.find("DTCORE_TIMEOUT='abc'"), std::string::npos) << t.message;
  EXPECT_FALSE(t.fix.empty());
  EXPECT_EQ(problems[2].field, "backend");
  EXPECT_EQ(problems[2].value, "mpi");
  EXPECT_EQ(s.timeout_s.value, 300.0);
  EXPECT_EQ(s.timeout_s.source, "default: DTCORE_TIMEOUT is invalid");
  EXPECT_EQ(s.backend.value, "auto");
  EXPECT_EQ(s.log_dir.value, "/d");  // the good values are still read
}

TEST(Settings, ArgumentsOfTheWrongTypeAreRefusedAsWritten) {
  expect_contains(refusal(Env(), {{"timeout", Argument{std::string("300")}}}),
                  {"init(timeout='300') must be a number of seconds", "Fix:"});
  expect_contains(refusal(Env(), {{"timeout", Argument{true}}}), {"init(timeout=True) must be a number"});
  expect_contains(refusal(Env(), {{"backend", Argument{true}}}), {"init(backend=True) must be a string", "Fix:"});
  expect_contains(refusal(Env(), {{"log_dir", Argument{int64_t{3}}}}), {"init(log_dir=3) must be a string"});
  std::vector<Problem> problems;
  read_settings(Env(), {{"backend", Argument{int64_t{1}}}}, &problems);
  ASSERT_EQ(problems.size(), 1u);
  EXPECT_EQ(problems[0].variable, "init(backend=)");
}

TEST(Settings, AnArgumentInitDoesNotPassHereIsADtcoreBug) {
  EXPECT_THROW(read_settings(Env(), {{"log_level", Argument{std::string("debug")}}}), std::logic_error);
}

TEST(LogRanks, ParsedFromTheVariable) {
  EXPECT_TRUE(ranks_of("all").all);
  EXPECT_TRUE(ranks_of("ALL").includes(12345));
  EXPECT_EQ(ranks_of("0,3").ranks, (std::vector<int>{0, 3}));
  EXPECT_EQ(ranks_of(" 1 , 2 ").ranks, (std::vector<int>{1, 2}));
  EXPECT_EQ(ranks_of("7").ranks, (std::vector<int>{7}));
  EXPECT_EQ(ranks_of("0,3").to_string(), "0,3");
  EXPECT_EQ(ranks_of("all").to_string(), "all");
  EXPECT_TRUE(ranks_of("0,3").includes(3));
  EXPECT_FALSE(ranks_of("0,3").includes(1));
}

TEST(LogRanks, AnythingButRanksIsRefusedNamingThePart) {
  expect_contains(refusal(vars({{"DTCORE_LOG_RANKS", "-1"}})), {"DTCORE_LOG_RANKS='-1'", "'-1' is not a rank", "Fix:"});
  expect_contains(refusal(vars({{"DTCORE_LOG_RANKS", "x"}})), {"'x' is not a rank"});
  expect_contains(refusal(vars({{"DTCORE_LOG_RANKS", "0-3"}})), {"'0-3' is not a rank"});
}

TEST(LogRanks, EmptyPartsAndBlanksAreForgivenAsBefore) {
  EXPECT_EQ(read_settings(vars({{"DTCORE_LOG_RANKS", "0,,1"}})).log_ranks.value.to_string(), "0,1");
  EXPECT_EQ(read_settings(vars({{"DTCORE_LOG_RANKS", "1,"}})).log_ranks.value.to_string(), "1");
  EXPECT_TRUE(read_settings(vars({{"DTCORE_LOG_RANKS", " All "}})).log_ranks.value.all);
}

TEST(Settings, ConsoleLevelIsTheLogLevelOnChosenRanksAndWarnElsewhere) {
  Settings s = read_settings(vars({{"DTCORE_LOG_LEVEL", "debug"}, {"DTCORE_LOG_RANKS", "0,3"}}));
  EXPECT_EQ(s.console_level(0), log::Level::Debug);
  EXPECT_EQ(s.console_level(3), log::Level::Debug);
  EXPECT_EQ(s.console_level(1), log::Level::Warn);
  Settings quiet = read_settings(vars({{"DTCORE_LOG_LEVEL", "error"}}));
  EXPECT_EQ(quiet.console_level(1), log::Level::Error);  // never louder than asked
  Settings all = read_settings(vars({{"DTCORE_LOG_RANKS", "all"}}));
  EXPECT_EQ(all.console_level(9), log::Level::Info);
}

TEST(Settings, LogConfigCarriesTheRankItsConsoleLevelAndTheLogDir) {
  Settings s = read_settings(vars({{"DTCORE_LOG_LEVEL", "debug"}, {"DTCORE_LOG_DIR", "/logs"}}));
  log::Config zero = log_config(s, 0, 4, "node7");
  EXPECT_EQ(zero.rank, 0);
  EXPECT_EQ(zero.world_size, 4);
  EXPECT_EQ(zero.host, "node7");
  EXPECT_EQ(zero.console_level, log::Level::Debug);
  EXPECT_EQ(zero.log_dir, "/logs");
  EXPECT_EQ(log_config(s, 2, 4, "node7").console_level, log::Level::Warn);
}

TEST(Repr, ArgumentsAreWrittenAsPythonWouldWriteThem) {
  EXPECT_EQ(repr(Argument{true}), "True");
  EXPECT_EQ(repr(Argument{false}), "False");
  EXPECT_EQ(repr(Argument{int64_t{5}}), "5");
  EXPECT_EQ(repr(Argument{int64_t{-3}}), "-3");
  EXPECT_EQ(repr(Argument{2.5}), "2.5");
  EXPECT_EQ(repr(Argument{300.0}), "300.0");
  EXPECT_EQ(repr(Argument{-1.0}), "-1.0");
  EXPECT_EQ(repr(Argument{1e20}), "1e+20");
  EXPECT_EQ(repr(Argument{0.1}), "0.1");  // the shortest text that reads back, as Python's repr
  EXPECT_EQ(repr(Argument{-0.3}), "-0.3");
  EXPECT_EQ(repr(Argument{std::numeric_limits<double>::infinity()}), "inf");
  EXPECT_EQ(repr(Argument{std::string("gloo")}), "'gloo'");
}

TEST(Settings, AnArgumentOfTheWrongTypeKeepsItsValueInTheProblem) {
  std::vector<Problem> problems;
  read_settings(Env(), {{"timeout", Argument{std::string("300")}}}, &problems);
  ASSERT_EQ(problems.size(), 1u);
  EXPECT_EQ(problems[0].value, "'300'");
  EXPECT_EQ(problems[0].variable, "init(timeout=)");
}

TEST(Settings, ATimeoutBeyondWhatCanBeWaitedIsRefusedWhereverItComesFrom) {
  expect_contains(refusal(vars({{"DTCORE_TIMEOUT", "1e10"}})),
                  {"DTCORE_TIMEOUT='1e10' is longer than dtcore can wait", "Fix:"});
  expect_contains(refusal(Env(), {{"timeout", Argument{1e17}}}),
                  {"init(timeout=1e+17) is longer than dtcore can wait"});
  EXPECT_EQ(read_settings(vars({{"DTCORE_TIMEOUT", "1e9"}})).timeout_s.value, 1e9);
}
