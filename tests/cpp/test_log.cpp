// The logging facade: level names, and configure() with a per-rank log file in a temporary directory.
// Each test restores the default configuration, so that no other test in this binary logs to its file.
#include <gtest/gtest.h>

#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <iostream>
#include <regex>
#include <sstream>

#include "dtcore/common/error.h"
#include "dtcore/common/log.h"
#include "expect_error.h"

using namespace dtcore;
using dtcore::testing::error_of;
using dtcore::testing::expect_contains;
namespace fs = std::filesystem;

namespace {

std::string read_all(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A fresh temporary directory, removed with everything in it; the logging configuration is reset
// to the default first, so that the log file is closed before the directory goes.
class LogFile : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = (fs::temp_directory_path() / "dtcore-test-log-XXXXXX").string();
    ASSERT_NE(mkdtemp(pattern.data()), nullptr);
    dir_ = pattern;
  }
  void TearDown() override {
    log::configure(log::Config{});
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  log::Config config(int rank, int world_size, std::string log_dir) {
    log::Config c;
    c.rank = rank;
    c.world_size = world_size;
    c.host = "testhost";
    c.log_dir = std::move(log_dir);
    return c;
  }
  fs::path dir_;
};

}  // namespace

TEST(LogLevel, ParsedCaseInsensitively) {
  EXPECT_EQ(log::parse_level("debug", "x"), log::Level::Debug);
  EXPECT_EQ(log::parse_level("INFO", "x"), log::Level::Info);
  EXPECT_EQ(log::parse_level("Warn", "x"), log::Level::Warn);
  EXPECT_EQ(log::parse_level("warning", "x"), log::Level::Warn);
  EXPECT_EQ(log::parse_level("WARNING", "x"), log::Level::Warn);
  EXPECT_EQ(log::parse_level("error", "x"), log::Level::Error);
}

TEST(LogLevel, AnUnknownLevelIsAConfigErrorNamingTheSource) {
  for (const char* bad : {"verbose", "", "err", "info "}) {
    std::string m = error_of<ConfigError>([&] { log::parse_level(bad, "DTCORE_LOG_LEVEL"); });
    expect_contains(m, {"DTCORE_LOG_LEVEL='", "is not a log level", "Fix:", "debug, info, warn, error"});
    EXPECT_NE(m.find(std::string("'") + bad + "'"), std::string::npos) << m;
  }
}

TEST(LogLevel, NamesParseBackToTheirLevel) {
  EXPECT_EQ(log::level_name(log::Level::Debug), "debug");
  EXPECT_EQ(log::level_name(log::Level::Info), "info");
  EXPECT_EQ(log::level_name(log::Level::Warn), "warn");
  EXPECT_EQ(log::level_name(log::Level::Error), "error");
  for (auto level : {log::Level::Debug, log::Level::Info, log::Level::Warn, log::Level::Error}) {
    EXPECT_EQ(log::parse_level(log::level_name(level), "x"), level);
  }
}

TEST_F(LogFile, WithoutALogDirThereIsNoFileAndDebugIsOff) {
  EXPECT_EQ(log::configure(config(0, 2, "")), "");
  EXPECT_FALSE(log::enabled(log::Level::Debug));
  EXPECT_TRUE(log::enabled(log::Level::Info));
  log::Config quiet = config(1, 2, "");
  quiet.console_level = log::Level::Warn;
  log::configure(quiet);
  EXPECT_FALSE(log::enabled(log::Level::Info));
  EXPECT_TRUE(log::enabled(log::Level::Warn));
  EXPECT_TRUE(fs::is_empty(dir_));
}

TEST_F(LogFile, TheFileIsNamedByTimeAndRankInTheLogDir) {
  std::string path = log::configure(config(3, 8, dir_.string()));
  ASSERT_FALSE(path.empty());
  EXPECT_EQ(fs::path(path).parent_path(), dir_);
  std::string name = fs::path(path).filename().string();
  EXPECT_TRUE(std::regex_match(name, std::regex(R"(dtcore-\d{8}-\d{6}-rank3\.log)"))) << name;
  EXPECT_TRUE(fs::exists(path));
}

TEST_F(LogFile, EveryLineReachesTheFileWithTheRankPrefixDebugIncluded) {
  log::Config c = config(3, 8, dir_.string());
  c.console_level = log::Level::Warn;  // the console's level does not filter the file
  std::string path = log::configure(c);
  EXPECT_TRUE(log::enabled(log::Level::Debug));
  log::write(log::Level::Info, "written with write()");
  log::info("info line ", 42);
  log::debug("debug line ", 1.5);
  log::warn("warn line");
  log::flush();
  std::string text = read_all(path);
  expect_contains(text, {"[rank 3/8 testhost] written with write()", "[rank 3/8 testhost] info line 42",
                         "[rank 3/8 testhost] debug line 1.5", "[rank 3/8 testhost] warn line"});
  EXPECT_LT(text.find("info line"), text.find("debug line")) << text;  // in the order written
}

TEST_F(LogFile, BeforeRendezvousTheRankIsAQuestionMark) {
  std::string path = log::configure(config(-1, -1, dir_.string()));
  log::info("early line");
  log::flush();
  EXPECT_NE(read_all(path).find("[rank ?/? testhost] early line"), std::string::npos) << read_all(path);
}

TEST_F(LogFile, AMissingLogDirIsCreated) {
  fs::path nested = dir_ / "a" / "b";
  std::string path = log::configure(config(0, 1, nested.string()));
  EXPECT_TRUE(fs::is_directory(nested));
  EXPECT_EQ(fs::path(path).parent_path(), nested);
}

TEST_F(LogFile, ALogDirThatCannotBeCreatedNamesTheVariable) {
  fs::path file = dir_ / "a-file";
  std::ofstream(file) << "not a directory";
  fs::path bad = file / "logs";
  std::string m = error_of<ConfigError>([&] { log::configure(config(0, 1, bad.string())); });
  expect_contains(m, {"cannot be created", "DTCORE_LOG_DIR", "init(log_dir=", "Fix:"});
  EXPECT_NE(m.find(bad.string()), std::string::npos) << m;
}

TEST_F(LogFile, ReconfiguringWithoutALogDirStopsWritingTheFile) {
  std::string path = log::configure(config(0, 1, dir_.string()));
  log::info("before");
  log::configure(config(0, 1, ""));
  log::info("after");
  log::flush();
  std::string text = read_all(path);
  EXPECT_NE(text.find("before"), std::string::npos) << text;  // flushed when the sinks were replaced
  EXPECT_EQ(text.find("after"), std::string::npos) << text;
}

TEST_F(LogFile, CppStackTracesOnStdCerrGoToTheFileAndTheirFirstLineStaysOnTheConsole) {
  // What c10's logger writes for a c10d warning that embeds a c10::Error (Note [C++ stack traces on the console]).
  std::string path = log::configure(config(1, 2, dir_.string()));
  ::testing::internal::CaptureStderr();
  std::cerr << "[W1126 12:00:00.0 TCPStore.cpp:106] [c10d] sendBytes failed on SocketImpl(fd=3): Broken pipe\n"
               "Exception raised from sendBytes at Utils.hpp:758 (most recent call first):\n"
               "frame #0: c10::Error::Error() + 0x9d (0x7f in libc10.so)\n"
               "<omitting python frames>\n"
               "frame #1: _start + 0x21 (0x55 in python)\n"
               "\n"
            << std::flush;
  std::cerr << "a plain line\n" << std::flush;
  std::cerr << "partial, flushed" << std::flush;
  std::string console = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(console,
            "[W1126 12:00:00.0 TCPStore.cpp:106] [c10d] sendBytes failed on SocketImpl(fd=3): Broken pipe\n"
            "a plain line\npartial, flushed");
  log::flush();
  std::string text = read_all(path);
  expect_contains(text, {"[D] [rank 1/2 testhost] C++ stack trace of the torch message \"[W1126 12:00:00.0 "
                         "TCPStore.cpp:106] [c10d] sendBytes failed on SocketImpl(fd=3): Broken pipe\" (cut from the "
                         "console):\nException raised from sendBytes at Utils.hpp:758",
                         "\nframe #0: c10::Error::Error()", "\n<omitting python frames>\nframe #1: _start"});
  EXPECT_EQ(text.find("a plain line"), std::string::npos) << text;
}
