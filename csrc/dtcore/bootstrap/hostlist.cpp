#include "dtcore/bootstrap/hostlist.h"

#include <algorithm>
#include <charconv>

#include "dtcore/common/error.h"

namespace dtcore {
namespace {

// Splits at commas that are not inside brackets.
std::vector<std::string_view> split_top_level(std::string_view text, std::string_view source) {
  std::vector<std::string_view> parts;
  int depth = 0;
  size_t start = 0;
  for (size_t i = 0; i < text.size(); ++i) {
    char c = text[i];
    if (c == '[') {
      DTCORE_CHECK(depth == 0, ConfigError, source, "='", text, "' has nested '[' at position ", i,
                   ". Fix: give a SLURM hostlist such as gpu[01-04,07],cpu3.");
      ++depth;
    } else if (c == ']') {
      DTCORE_CHECK(depth == 1, ConfigError, source, "='", text, "' has an unmatched ']' at position ", i,
                   ". Fix: give a SLURM hostlist such as gpu[01-04,07],cpu3.");
      --depth;
    } else if (c == ',' && depth == 0) {
      parts.push_back(text.substr(start, i - start));
      start = i + 1;
    }
  }
  DTCORE_CHECK(depth == 0, ConfigError, source, "='", text,
               "' has an unclosed '['. Fix: give a SLURM hostlist such as gpu[01-04,07],cpu3.");
  parts.push_back(text.substr(start));
  return parts;
}

constexpr size_t kMaxHostCount = 1'000'000'000;  // count_hosts() saturates here
constexpr std::string_view kHostlistFix = " Fix: give a SLURM hostlist such as gpu[01-04,07],cpu3.";
constexpr std::string_view kTasksFix = " Fix: give SLURM_TASKS_PER_NODE as SLURM writes it, e.g. 4(x2),3.";

// A non-negative decimal number; `fix` says what the whole value should look like.
long parse_number(std::string_view digits, std::string_view text, std::string_view source,
                  std::string_view fix = kHostlistFix) {
  long value = -1;
  auto [ptr, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), value);
  DTCORE_CHECK(ec == std::errc() && ptr == digits.data() + digits.size() && !digits.empty() && value >= 0, ConfigError,
               source, "='", text, "' has '", digits, "' where a number belongs.", fix);
  return value;
}

// One range of a bracket body: "01-04" is {1, 4, 2}, "7" is {7, 7, 1}.
struct Range {
  long lo;
  long hi;
  size_t width;  // SLURM keeps the zero padding of the lower bound
};

// Parses one bracket body "01-04,07" into its ranges.
std::vector<Range> parse_range_list(std::string_view body, std::string_view text, std::string_view source) {
  std::vector<Range> out;
  size_t start = 0;
  while (start <= body.size()) {
    size_t comma = body.find(',', start);
    std::string_view item =
        body.substr(start, comma == std::string_view::npos ? std::string_view::npos : comma - start);
    size_t dash = item.find('-');
    std::string_view lo_s = item.substr(0, dash);
    std::string_view hi_s = dash == std::string_view::npos ? lo_s : item.substr(dash + 1);
    long lo = parse_number(lo_s, text, source);
    long hi = parse_number(hi_s, text, source);
    DTCORE_CHECK(lo <= hi, ConfigError, source, "='", text, "' has the range ", item,
                 " that runs backwards. Fix: write the smaller number first.");
    DTCORE_CHECK(hi - lo < 1000000, ConfigError, source, "='", text, "' has the range ", item,
                 " of more than a million hosts.", kHostlistFix);
    out.push_back(Range{lo, hi, lo_s.size()});
    if (comma == std::string_view::npos) break;
    start = comma + 1;
  }
  return out;
}

// `v` written with at least `width` digits, zero-padded as SLURM writes it.
std::string padded(long v, size_t width) {
  std::string s = std::to_string(v);
  if (s.size() < width) s.insert(0, width - s.size(), '0');
  return s;
}

// One top-level item ("rack[1-2]-gpu[01-02]") as literal text, each followed by the ranges of its
// bracket group; the last group of an item may have no ranges (its trailing literal).
struct Group {
  std::string_view literal;
  std::vector<Range> ranges;
};

std::vector<Group> parse_item(std::string_view item, std::string_view text, std::string_view source) {
  std::vector<Group> out;
  size_t pos = 0;
  while (pos < item.size()) {
    size_t open = item.find('[', pos);
    if (open == std::string_view::npos) {
      out.push_back(Group{item.substr(pos), {}});
      break;
    }
    size_t close = item.find(']', open);  // balanced: checked by split_top_level
    out.push_back(
        Group{item.substr(pos, open - pos), parse_range_list(item.substr(open + 1, close - open - 1), text, source)});
    pos = close + 1;
  }
  return out;
}

// A list such as "," names no host at all.
void check_names_a_host(size_t hosts, std::string_view text, std::string_view source) {
  DTCORE_CHECK(hosts > 0, ConfigError, source, "='", text,
               "' names no host. Fix: set MASTER_ADDR to rank 0's host, or run under srun, which sets it.");
}

// Expands one top-level item, which may hold several bracket groups ("rack[1-2]-gpu[01-02]"),
// stopping once `out` holds `limit` names (a range is walked, never expanded whole).
void expand_item(std::string_view item, std::string_view text, std::string_view source, std::vector<std::string>& out,
                 size_t limit) {
  std::vector<std::string> partial{""};
  for (const Group& g : parse_item(item, text, source)) {
    for (auto& p : partial) p.append(g.literal);
    if (g.ranges.empty()) continue;
    std::vector<std::string> next;
    for (const auto& p : partial) {
      for (const Range& r : g.ranges) {
        for (long v = r.lo; v <= r.hi && next.size() < limit; ++v) next.push_back(p + padded(v, r.width));
      }
      if (next.size() >= limit) break;
    }
    partial = std::move(next);
  }
  for (auto& p : partial) {
    if (out.size() >= limit) return;
    out.push_back(std::move(p));
  }
}

std::vector<std::string> expand(std::string_view text, std::string_view source, size_t limit) {
  std::vector<std::string> hosts;
  for (std::string_view item : split_top_level(text, source)) {
    if (item.empty()) continue;
    expand_item(item, text, source, hosts, limit);
    if (hosts.size() >= limit) break;
  }
  check_names_a_host(hosts.size(), text, source);
  return hosts;
}

// a * b, or kMaxHostCount when the product exceeds it.
size_t saturating_product(size_t a, size_t b) {
  if (a != 0 && b > kMaxHostCount / a) return kMaxHostCount;
  return std::min(a * b, kMaxHostCount);
}

}  // namespace

size_t count_hosts(std::string_view text, std::string_view source) {
  size_t total = 0;
  for (std::string_view item : split_top_level(text, source)) {
    if (item.empty()) continue;
    size_t names = 1;  // the product of the sizes of the item's bracket groups
    for (const Group& g : parse_item(item, text, source)) {
      if (g.ranges.empty()) continue;
      size_t choices = 0;
      for (const Range& r : g.ranges) choices += static_cast<size_t>(r.hi - r.lo + 1);
      names = saturating_product(names, choices);
    }
    total = std::min(total + names, kMaxHostCount);
  }
  check_names_a_host(total, text, source);
  return total;
}

std::vector<std::string> expand_hostlist(std::string_view text, std::string_view source) {
  return expand(text, source, static_cast<size_t>(-1));
}

std::string first_host(std::string_view text, std::string_view source) { return expand(text, source, 1).front(); }

std::vector<int> expand_tasks_per_node(std::string_view text, std::string_view source) {
  std::vector<int> out;
  for (std::string_view item : split_top_level(text, source)) {
    size_t paren = item.find('(');
    long count = parse_number(item.substr(0, paren), text, source, kTasksFix);
    long repeat = 1;
    if (paren != std::string_view::npos) {
      DTCORE_CHECK(item.size() > paren + 3 && item.substr(paren, 2) == "(x" && item.back() == ')', ConfigError, source,
                   "='", text, "' has '", item, "' where N or N(xK) belongs.", kTasksFix);
      repeat = parse_number(item.substr(paren + 2, item.size() - paren - 3), text, source, kTasksFix);
    }
    DTCORE_CHECK(count <= 1'000'000 && repeat >= 1 && repeat <= 1'000'000 &&
                     out.size() + static_cast<size_t>(repeat) <= 1'000'000,
                 ConfigError, source, "='", text, "' describes more than a million nodes or tasks per node.",
                 kTasksFix);
    out.insert(out.end(), static_cast<size_t>(repeat), static_cast<int>(count));
  }
  return out;
}

}  // namespace dtcore
