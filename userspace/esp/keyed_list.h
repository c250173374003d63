// Entries in the order they were added, found by key, added and removed at a constant cost:
// the configuration's tables (Config::sas, Config::policies), which must not cost more to
// change as they grow, and whose order means something (`ip xfrm` lists in it, and among
// policies of equal priority the first added wins).
//
// An entry's key must not change while it is in the list: replace() it instead.
#pragma once

#include <cstddef>
#include <initializer_list>
#include <iterator>
#include <list>
#include <unordered_map>

namespace xesp {

template <typename T, typename Key, typename KeyOf, typename Hash> class KeyedList {
public:
    using value_type = T;
    using iterator = typename std::list<T>::iterator;
    using const_iterator = typename std::list<T>::const_iterator;

    KeyedList() = default;
    KeyedList(std::initializer_list<T> init)
    {
        for (const T &v : init)
            push_back(v);
    }
    KeyedList(const KeyedList &o) : items_(o.items_) { reindex(); }
    KeyedList &operator=(const KeyedList &o)
    {
        if (this != &o) {
            items_ = o.items_;
            reindex();
        }
        return *this;
    }
    // std::list keeps its nodes, and with them the index's iterators, when moved.
    KeyedList(KeyedList &&) noexcept = default;
    KeyedList &operator=(KeyedList &&) noexcept = default;

    iterator begin() { return items_.begin(); }
    iterator end() { return items_.end(); }
    const_iterator begin() const { return items_.begin(); }
    const_iterator end() const { return items_.end(); }
    size_t size() const { return items_.size(); }
    bool empty() const { return items_.empty(); }
    T &front() { return items_.front(); }
    const T &front() const { return items_.front(); }
    T &back() { return items_.back(); }
    const T &back() const { return items_.back(); }
    // The i-th entry: walks the list (tests, messages).
    T &nth(size_t i) { return *std::next(items_.begin(), std::ptrdiff_t(i)); }
    const T &nth(size_t i) const { return *std::next(items_.begin(), std::ptrdiff_t(i)); }

    T *find(const Key &k)
    {
        auto it = index_.find(k);
        return it == index_.end() ? nullptr : &*it->second;
    }
    const T *find(const Key &k) const
    {
        auto it = index_.find(k);
        return it == index_.end() ? nullptr : &*it->second;
    }
    // At the end; an entry with the same key is replaced where it is.
    void push_back(T v)
    {
        Key k = KeyOf()(v);
        auto it = index_.find(k);
        if (it != index_.end()) {
            *it->second = std::move(v);
            return;
        }
        items_.push_back(std::move(v));
        index_.emplace(std::move(k), std::prev(items_.end()));
    }
    // In place of the entry with v's key; false if there is none.
    bool replace(T v)
    {
        auto it = index_.find(KeyOf()(v));
        if (it == index_.end())
            return false;
        *it->second = std::move(v);
        return true;
    }
    bool erase(const Key &k)
    {
        auto it = index_.find(k);
        if (it == index_.end())
            return false;
        items_.erase(it->second);
        index_.erase(it);
        return true;
    }
    void clear()
    {
        index_.clear();
        items_.clear();
    }
    void reserve(size_t n) { index_.reserve(n); }

private:
    void reindex()
    {
        index_.clear();
        index_.reserve(items_.size());
        for (auto it = items_.begin(); it != items_.end(); ++it)
            index_.emplace(KeyOf()(*it), it);
    }

    std::list<T> items_;
    std::unordered_map<Key, iterator, Hash> index_;
};

}  // namespace xesp
