// One error model for everything that talks to the kernel, libbpf, OpenSSL or a file:
// a value or an Error that says what failed and what to do. Exceptions stay at the CLI edge.
#pragma once

#include <string>
#include <system_error>
#include <utility>
#include <variant>

namespace xesp {

struct Error {
    std::string message;
    std::error_code code{};
};

inline Error make_error(std::string message, int errno_value = 0)
{
    return Error{std::move(message), errno_value
                                         ? std::error_code(errno_value, std::generic_category())
                                         : std::error_code()};
}

template <class T> class [[nodiscard]] Result {
public:
    Result(T value) : v_(std::move(value)) {}
    Result(Error error) : v_(std::move(error)) {}

    bool ok() const { return v_.index() == 0; }
    explicit operator bool() const { return ok(); }
    T &value() { return std::get<0>(v_); }
    const T &value() const { return std::get<0>(v_); }
    T &operator*() { return value(); }
    const T &operator*() const { return value(); }
    T *operator->() { return &value(); }
    const T *operator->() const { return &value(); }
    const Error &error() const { return std::get<1>(v_); }

private:
    std::variant<T, Error> v_;
};

template <> class [[nodiscard]] Result<void> {
public:
    Result() = default;
    Result(Error error) : error_(std::move(error)), ok_(false) {}

    bool ok() const { return ok_; }
    explicit operator bool() const { return ok_; }
    const Error &error() const { return error_; }

private:
    Error error_;
    bool ok_ = true;
};

}  // namespace xesp
