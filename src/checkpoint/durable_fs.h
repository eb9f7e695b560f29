// The few filesystem operations that make checkpoint saving crash-consistent: every
// write reaches the disk (fsync) before the rename that publishes it, and every rename
// is made durable by an fsync of its directory. A crash at any instant leaves either the
// old state or the new one, never a mixture.
#pragma once
#include <cstddef>
#include <string>

namespace lattice {

// Creates (or truncates) `path`, writes n bytes and fsyncs it. Not atomic by itself:
// used for files inside a not-yet-published temporary directory.
void write_file_synced(const std::string& path, const void* data, size_t n);

// Replaces `path` atomically: writes path.tmp, fsyncs it, renames it over path and
// fsyncs the directory.
void write_file_atomic(const std::string& path, const std::string& text);

// fsync of a file written by other means (a library's writer) before it is renamed into place.
void fsync_file(const std::string& path);

// fsync of a directory (makes creations, renames and removals in it durable).
void fsync_dir(const std::string& dir);

// Publishes the complete directory `staged` as `target` (same parent directory) in one
// atomic step: a plain rename when `target` does not exist, otherwise an atomic exchange
// (renameat2 RENAME_EXCHANGE) after which the old `target` is deleted. The parent is
// fsynced, so `target` is durably the new directory when this returns.
void publish_dir(const std::string& staged, const std::string& target);

// Deletes a directory tree so that no half-deleted copy stays under its name: renames it
// to `trash` (same parent) first, fsyncs the parent, then removes `trash`.
void remove_dir_durably(const std::string& dir, const std::string& trash);

}  // namespace lattice
