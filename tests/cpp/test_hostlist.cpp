// SLURM hostlist and tasks-per-node expansion.
#include <gtest/gtest.h>

#include "dtcore/bootstrap/hostlist.h"
#include "dtcore/common/error.h"

using dtcore::ConfigError;
using dtcore::count_hosts;
using dtcore::expand_hostlist;
using dtcore::expand_tasks_per_node;
using dtcore::first_host;

TEST(Hostlist, PlainNamesAndCommas) {
  EXPECT_EQ(expand_hostlist("node1", "X"), (std::vector<std::string>{"node1"}));
  EXPECT_EQ(expand_hostlist("a,b,c", "X"), (std::vector<std::string>{"a", "b", "c"}));
}

TEST(Hostlist, CompressedRangesKeepZeroPadding) {
  EXPECT_EQ(expand_hostlist("gpu[01-04,07],cpu3", "X"),
            (std::vector<std::string>{"gpu01", "gpu02", "gpu03", "gpu04", "gpu07", "cpu3"}));
  EXPECT_EQ(expand_hostlist("n[8-11]", "X"), (std::vector<std::string>{"n8", "n9", "n10", "n11"}));
}

TEST(Hostlist, SeveralBracketGroupsInOneName) {
  EXPECT_EQ(expand_hostlist("rack[1-2]-gpu[01-02]", "X"),
            (std::vector<std::string>{"rack1-gpu01", "rack1-gpu02", "rack2-gpu01", "rack2-gpu02"}));
}

TEST(Hostlist, FirstHostIsMaster) {
  EXPECT_EQ(first_host("gpu[01-04,07],cpu3", "SLURM_JOB_NODELIST"), "gpu01");
  EXPECT_EQ(first_host("cpu3,gpu[01-04]", "SLURM_JOB_NODELIST"), "cpu3");
  EXPECT_EQ(first_host("big[000001-999999]", "SLURM_JOB_NODELIST"), "big000001");
}

TEST(Hostlist, MalformedListsNameTheVariable) {
  for (const char* bad : {"gpu[01-04", "gpu01-04]", "gpu[04-01]", "gpu[a-b]", "gpu[[1]]", ""}) {
    try {
      expand_hostlist(bad, "SLURM_JOB_NODELIST");
      ADD_FAILURE() << "accepted " << bad;
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("SLURM_JOB_NODELIST"), std::string::npos) << e.what();
    }
  }
}

TEST(Hostlist, CountWithoutExpanding) {
  EXPECT_EQ(count_hosts("localhost", "X"), 1u);
  EXPECT_EQ(count_hosts("gpu[01-04,07],cpu3", "X"), 6u);
  EXPECT_EQ(count_hosts("rack[1-2]-gpu[01-02],x", "X"), 5u);
  for (const char* text : {"gpu[01-04,07],cpu3", "rack[1-2]-gpu[01-02]", "a,,b", "n[8-11]"}) {
    EXPECT_EQ(count_hosts(text, "X"), expand_hostlist(text, "X").size()) << text;
  }
  // A product too large to expand saturates instead.
  EXPECT_EQ(count_hosts("a[0-999999]b[0-999999]", "X"), 1'000'000'000u);
  for (const char* bad : {"gpu[01-04", "gpu[04-01]", "gpu[a-b]", "", ","}) {
    EXPECT_THROW(count_hosts(bad, "SLURM_JOB_NODELIST"), ConfigError) << bad;
  }
}

TEST(TasksPerNode, ExpandsRepeats) {
  EXPECT_EQ(expand_tasks_per_node("4(x2),3", "X"), (std::vector<int>{4, 4, 3}));
  EXPECT_EQ(expand_tasks_per_node("8", "X"), (std::vector<int>{8}));
  EXPECT_THROW(expand_tasks_per_node("4(y2)", "SLURM_TASKS_PER_NODE"), ConfigError);
  EXPECT_THROW(expand_tasks_per_node("x", "SLURM_TASKS_PER_NODE"), ConfigError);
  EXPECT_THROW(expand_tasks_per_node("4(x-1)", "SLURM_TASKS_PER_NODE"), ConfigError);
  EXPECT_THROW(expand_tasks_per_node("-4", "SLURM_TASKS_PER_NODE"), ConfigError);
  EXPECT_THROW(expand_tasks_per_node("4(x4000000000)", "SLURM_TASKS_PER_NODE"), ConfigError);
  try {
    expand_tasks_per_node("4(y2)", "SLURM_TASKS_PER_NODE");
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("e.g. 4(x2),3"), std::string::npos) << e.what();
  }
}
