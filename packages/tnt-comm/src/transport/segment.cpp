#include "transport/segment.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "tnt_comm/types.hpp"

namespace tnt {
namespace {

std::byte* map_fd(int fd, std::size_t bytes, const std::string& name) {
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) throw Error("cannot map shared memory " + name + ": " + std::strerror(errno));
  return static_cast<std::byte*>(p);
}

}  // namespace

MappedMemory& MappedMemory::operator=(MappedMemory&& other) noexcept {
  if (this != &other) {
    this->~MappedMemory();
    data_ = other.data_;
    size_ = other.size_;
    owned_name_ = std::move(other.owned_name_);
    other.data_ = nullptr;
    other.size_ = 0;
    other.owned_name_.clear();
  }
  return *this;
}

MappedMemory::~MappedMemory() {
  unlink();
  if (data_ != nullptr) ::munmap(data_, size_);
  data_ = nullptr;
}

void MappedMemory::unlink() {
  if (!owned_name_.empty()) ::shm_unlink(owned_name_.c_str());
  owned_name_.clear();
}

void MappedMemory::keep_until_exit() {
  unlink();
  data_ = nullptr;
  size_ = 0;
}

MappedMemory MappedMemory::create_shared(const std::string& name, std::size_t bytes, int* keep_fd) {
  int fd = ::shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0) {
    throw Error("cannot create shared memory " + name + ": " + std::strerror(errno) +
                " (is another job using the same TNT_JOB_ID?)");
  }
  MappedMemory m;
  m.owned_name_ = name;  // from here on the destructor unlinks it
  if (::ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    int err = errno;
    ::close(fd);
    ::shm_unlink(name.c_str());
    throw Error("cannot size shared memory " + name + ": " + std::strerror(err) +
                " (is /dev/shm large enough?)");
  }
  try {
    m.data_ = map_fd(fd, bytes, name);
  } catch (...) {
    ::close(fd);
    throw;
  }
  m.size_ = bytes;
  if (keep_fd != nullptr) {
    *keep_fd = fd;
  } else {
    ::close(fd);
  }
  return m;
}

MappedMemory MappedMemory::open_shared(const std::string& name, std::size_t bytes) {
  int fd = ::shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0) throw Error("cannot open shared memory " + name + ": " + std::strerror(errno));
  MappedMemory m;
  m.data_ = map_fd(fd, bytes, name);
  m.size_ = bytes;
  ::close(fd);
  return m;
}

MappedMemory MappedMemory::anonymous(std::size_t bytes) {
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) throw Error(std::string("cannot allocate segment: ") + std::strerror(errno));
  MappedMemory m;
  m.data_ = static_cast<std::byte*>(p);
  m.size_ = bytes;
  return m;
}

}  // namespace tnt
