// core/files.h: reading a whole file, and writing one so that no reader ever sees half of it.
#pragma once

#include <functional>
#include <span>
#include <string>
#include <string_view>

namespace pt {

// The file's bytes. UserError naming the path, ending with `todo`, when it cannot be read.
std::string read_file(const std::string& path, const std::string& todo);

// Writes the parts, one after the other, to `path` through a temporary file that is flushed to
// disk (fsync) and renamed into place, then syncs the folder: the name holds the old content or
// all of the new, even if the process is killed. Writers of one path at the same time each put a
// whole file there; the last rename wins. The temporary file is named PATH.PID.N.tmp. On failure
// nothing is left behind and a UserError names the path, ending with `todo` (e.g. "choose
// another --csv").
void write_file_atomic(const std::string& path, std::span<const std::string_view> parts,
                       const std::string& todo);
void write_file_atomic(const std::string& path, std::string_view text, const std::string& todo);
// As above, the content written by `write_to` to the temporary file's descriptor (false: it
// failed): for a writer that streams what it would otherwise build whole in memory first. An
// exception from write_to leaves nothing behind either, and goes on.
void write_file_atomic(const std::string& path, const std::function<bool(int fd)>& write_to,
                       const std::string& todo);
// As above, `count` parts made one at a time: part(i) is written before part(i + 1) is asked for
// (a view valid until then), so the writer holds one part at a time (a tensor brought from
// another process, read from a file).
void write_file_atomic(const std::string& path, size_t count, const std::function<std::string_view(size_t i)>& part,
                       const std::string& todo);

// Makes the folders above `path` that do not exist yet; a failure shows when the file is written.
void make_parent(const std::string& path);

}  // namespace pt
