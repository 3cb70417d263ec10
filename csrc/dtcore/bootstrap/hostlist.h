// SLURM hostlist and tasks-per-node expressions.
//
// SLURM compresses node lists ("gpu[01-04,07],cpu3") and task counts ("4(x2),3"); dtcore needs
// the first host (rank 0's node, the rendezvous master) and the tasks on each node. The full
// grammar is implemented: several bracket groups in one name, zero-padded ranges, and commas
// inside and outside brackets. Thread safety: pure functions.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace dtcore {

// Expands a hostlist into host names, in order. Throws ConfigError naming `source` and the
// text when it is malformed (unbalanced brackets, a range that runs backwards, ...).
std::vector<std::string> expand_hostlist(std::string_view text, std::string_view source);

// The number of host names a hostlist expands to (duplicates counted), without expanding it;
// saturates at a billion. ConfigError as expand_hostlist() when malformed or empty.
size_t count_hosts(std::string_view text, std::string_view source);

// The first host of a hostlist, without expanding the rest.
std::string first_host(std::string_view text, std::string_view source);

// Expands SLURM_TASKS_PER_NODE ("4(x2),3" -> {4, 4, 3}). ConfigError when malformed.
std::vector<int> expand_tasks_per_node(std::string_view text, std::string_view source);

}  // namespace dtcore
