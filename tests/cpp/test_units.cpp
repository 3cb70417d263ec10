// Sizes and durations as users write them: parse_bytes (SI and IEC units), format_bytes, seconds_to_timeout.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "dtcore/common/error.h"
#include "dtcore/common/units.h"
#include "expect_error.h"

using namespace dtcore;
using dtcore::testing::error_of;
using dtcore::testing::expect_contains;

namespace {

constexpr int64_t kKiB = int64_t{1} << 10;
constexpr int64_t kMiB = int64_t{1} << 20;
constexpr int64_t kGiB = int64_t{1} << 30;
constexpr int64_t kTiB = int64_t{1} << 40;

// The message of parse_bytes refusing `text` as the size named "budget".
std::string refusal(const std::string& text) {
  return error_of<ConfigError>([&] { parse_bytes(text, "budget"); });
}

}  // namespace

TEST(ParseBytes, SiUnitsArePowersOfAThousand) {
  EXPECT_EQ(parse_bytes("2kB", "x"), 2'000);
  EXPECT_EQ(parse_bytes("3MB", "x"), 3'000'000);
  EXPECT_EQ(parse_bytes("2GB", "x"), 2'000'000'000);
  EXPECT_EQ(parse_bytes("4TB", "x"), 4'000'000'000'000);
}

TEST(ParseBytes, IecUnitsArePowersOf1024) {
  EXPECT_EQ(parse_bytes("1KiB", "x"), kKiB);
  EXPECT_EQ(parse_bytes("768MiB", "x"), 768 * kMiB);
  EXPECT_EQ(parse_bytes("2GiB", "x"), 2 * kGiB);
  EXPECT_EQ(parse_bytes("3TiB", "x"), 3 * kTiB);
}

TEST(ParseBytes, PlainNumbersAndTheByteUnitAreBytes) {
  EXPECT_EQ(parse_bytes("4096", "x"), 4096);
  EXPECT_EQ(parse_bytes("4096B", "x"), 4096);
  EXPECT_EQ(parse_bytes("1", "x"), 1);
}

TEST(ParseBytes, UnitsAreCaseInsensitiveAndBlanksAreAllowed) {
  EXPECT_EQ(parse_bytes("2gb", "x"), 2'000'000'000);
  EXPECT_EQ(parse_bytes("2Gb", "x"), 2'000'000'000);
  EXPECT_EQ(parse_bytes("1kib", "x"), kKiB);
  EXPECT_EQ(parse_bytes("1KIB", "x"), kKiB);
  EXPECT_EQ(parse_bytes("4096 b", "x"), 4096);
  EXPECT_EQ(parse_bytes("  2 GB  ", "x"), 2'000'000'000);
  EXPECT_EQ(parse_bytes("\t512\tMiB\n", "x"), 512 * kMiB);
}

TEST(ParseBytes, FractionsOfAUnit) {
  EXPECT_EQ(parse_bytes("1.5GiB", "x"), 1'610'612'736);
  EXPECT_EQ(parse_bytes("0.5KiB", "x"), 512);
  EXPECT_EQ(parse_bytes("1.5kB", "x"), 1'500);
  EXPECT_EQ(parse_bytes("2.25 MiB", "x"), 2 * kMiB + kMiB / 4);
}

TEST(ParseBytes, ABareKMGOrTIsRefusedAsAmbiguous) {
  for (const char* text : {"2K", "2M", "2G", "2T", "2k", "2 g"}) {
    std::string m = refusal(text);
    expect_contains(m, {"ambiguous", "Fix:"});
    EXPECT_NE(m.find(std::string("'") + text + "'"), std::string::npos) << m;
  }
}

TEST(ParseBytes, UnknownUnitsAndNonNumbersAreRefused) {
  for (const char* text : {"2XB", "2 bytes", "2PB", "2KB2", "1e3", "1.2.3GB", "GB", "abc", "0x10"}) {
    std::string m = refusal(text);
    expect_contains(m, {"is not a size in bytes", "Fix:"});
    EXPECT_EQ(m.find("ambiguous"), std::string::npos) << m;
  }
}

TEST(ParseBytes, SizesUnderOneByteNegativeEmptyAndHugeAreRefused) {
  for (const char* text : {"0", "0B", "0.5", "0.0001KiB", "-1", "-1GB", "", "   ", "99999999TB", "10000000TiB"}) {
    expect_contains(refusal(text), {"is not a size in bytes", "Fix:"});
  }
}

TEST(ParseBytes, MessagesStartWithWhatAndShowTheValueAsWritten) {
  std::string m = error_of<ConfigError>([] { parse_bytes("12 parsecs", "DTCORE_ACT_BUDGET"); });
  EXPECT_EQ(m.rfind("DTCORE_ACT_BUDGET '12 parsecs'", 0), 0u) << m;
  expect_contains(m, {"Fix:", "2GB", "1.5GiB", "10^9", "2^30"});
}

TEST(ParseBytes, AFractionOfAByteIsRefusedAFractionOfALargerUnitRoundsDown) {
  expect_contains(error_of<ConfigError>([] { parse_bytes("1.5B", "the budget"); }),
                  {"the budget '1.5B' is not a size in bytes: a byte count is a whole number", "Fix:"});
  expect_contains(error_of<ConfigError>([] { parse_bytes("2.5", "size"); }), {"a byte count is a whole number"});
  EXPECT_EQ(parse_bytes("1.1GiB", "size"), 1'181'116'006);  // 1'181'116'006.4 bytes, down to a whole byte
  EXPECT_EQ(parse_bytes("2.0", "size"), 2);
}

TEST(FormatBytes, BytesBelowOneKiB) {
  EXPECT_EQ(format_bytes(0), "0 B");
  EXPECT_EQ(format_bytes(8), "8 B");
  EXPECT_EQ(format_bytes(1023), "1023 B");
}

TEST(FormatBytes, WholeUnitsAreExact) {
  EXPECT_EQ(format_bytes(kKiB), "1 KiB");
  EXPECT_EQ(format_bytes(65536), "64 KiB");
  EXPECT_EQ(format_bytes(768 * kMiB), "768 MiB");
  EXPECT_EQ(format_bytes(3 * kGiB), "3 GiB");
  EXPECT_EQ(format_bytes(5 * kTiB), "5 TiB");
  EXPECT_EQ(format_bytes(2048 * kTiB), "2048 TiB");  // TiB is the largest unit
}

TEST(FormatBytes, OtherSizesHaveOneDecimalInTheLargestUnitThatFits) {
  EXPECT_EQ(format_bytes(1'610'612'736), "1.5 GiB");
  EXPECT_EQ(format_bytes(100'000), "97.7 KiB");
  EXPECT_EQ(format_bytes(1'500), "1.5 KiB");
  EXPECT_EQ(format_bytes(kMiB + 1), "1.0 MiB");  // not a whole MiB, so not written as one
  EXPECT_EQ(format_bytes(2'000'000'000), "1.9 GiB");
  EXPECT_EQ(format_bytes(kMiB - 1), "1.0 MiB");  // 1023.999 KiB rounds up into the next unit
  EXPECT_EQ(format_bytes(kKiB - 1), "1023 B");
}

TEST(FormatBytes, NegativeSizesKeepTheirSign) {
  EXPECT_EQ(format_bytes(-8), "-8 B");
  EXPECT_EQ(format_bytes(-65536), "-64 KiB");
  EXPECT_EQ(format_bytes(-1536), "-1.5 KiB");
  EXPECT_EQ(format_bytes(std::numeric_limits<int64_t>::min()), "-8388608 TiB");
}

TEST(FormatBytes, WholeUnitsParseBackToTheSameSize) {
  for (int64_t bytes : {int64_t{1}, int64_t{1000}, kKiB, 64 * kKiB, 768 * kMiB, 3 * kGiB, 7 * kTiB}) {
    EXPECT_EQ(parse_bytes(format_bytes(bytes), "x"), bytes) << format_bytes(bytes);
  }
}

TEST(SecondsToTimeout, PositiveSecondsBecomeMilliseconds) {
  EXPECT_EQ(seconds_to_timeout(300, "timeout"), std::chrono::milliseconds(300'000));
  EXPECT_EQ(seconds_to_timeout(0.25, "timeout"), std::chrono::milliseconds(250));
  EXPECT_EQ(seconds_to_timeout(1.5, "timeout"), std::chrono::milliseconds(1'500));
}

TEST(SecondsToTimeout, ATinyTimeoutIsNeverRoundedDownToZero) {
  // 0 ms is "no timeout" to the engines: the opposite of what was asked.
  EXPECT_EQ(seconds_to_timeout(1e-6, "timeout"), std::chrono::milliseconds(1));
  EXPECT_EQ(seconds_to_timeout(0.0004, "timeout"), std::chrono::milliseconds(1));
}

TEST(SecondsToTimeout, ZeroNegativeAndNonFiniteAreRefusedNamingWhat) {
  const double bad[] = {0.0, -1.0, -0.001, std::numeric_limits<double>::infinity(),
                        std::numeric_limits<double>::quiet_NaN()};
  for (double s : bad) {
    std::string m = error_of<ConfigError>([&] { seconds_to_timeout(s, "init(timeout=)"); });
    EXPECT_EQ(m.rfind("init(timeout=)=", 0), 0u) << m;
    expect_contains(m, {"is not a positive number of seconds", "Fix:"});
  }
  expect_contains(error_of<ConfigError>([] { seconds_to_timeout(-5, "heartbeat"); }), {"heartbeat=-5"});
}

// Disabled: seconds * 1000 is cast to int64 unchecked, so a finite timeout past ~9.2e15 s (e.g.
// DTCORE_TIMEOUT=1e17, meaning "wait for ever") overflows (undefined behaviour) and comes back as 1 ms
// on x86-64. Either refusing it or clamping it is right; 1 ms is not. Enable once fixed.
TEST(SecondsToTimeout, AHugeTimeoutDoesNotBecomeOneMillisecond) {
  for (double s : {1e16, 1e17, 1e300}) {
    try {
      EXPECT_GE(seconds_to_timeout(s, "timeout"), std::chrono::milliseconds(int64_t{1} << 50)) << s;
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("timeout="), std::string::npos) << e.what();
    }
  }
}
