#pragma once
// A plain-text table: columns padded to their widest cell, numbers right-aligned.
#include <algorithm>
#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

namespace memcalc::cli {

class TextTable {
public:
    enum class Align { left, right };

    explicit TextTable(std::vector<Align> aligns, std::string indent = "  ")
        : aligns_(std::move(aligns)), indent_(std::move(indent)) {}

    void row(std::vector<std::string> cells) { rows_.push_back(std::move(cells)); }
    /// A row written in place, of literals, strings and a table row's text alike.
    void row(std::initializer_list<std::string_view> cells) {
        rows_.emplace_back(cells.begin(), cells.end());
    }
    void rule() { rows_.emplace_back(); }  ///< an empty row renders as a dashed line

    std::string str() const {
        std::vector<std::size_t> width(aligns_.size(), 0);
        for (const auto& r : rows_)
            for (std::size_t c = 0; c < r.size() && c < width.size(); ++c)
                width[c] = std::max(width[c], length(r[c]));
        std::size_t total = 0;
        for (auto w : width) total += w + 2;
        std::string out;
        for (const auto& r : rows_) {
            std::string line = indent_;
            if (r.empty()) line += std::string(total > 2 ? total - 2 : 0, '-');
            for (std::size_t c = 0; c < r.size() && c < width.size(); ++c) {
                const std::string pad(width[c] - length(r[c]), ' ');
                line += aligns_[c] == Align::right ? pad + r[c] : r[c] + pad;
                if (c + 1 < r.size()) line += "  ";
            }
            while (!line.empty() && line.back() == ' ') line.pop_back();
            out += line + "\n";
        }
        return out;
    }

private:
    /// Display width: counts UTF-8 code points, not bytes, so a "x" or "^" lines up either way.
    static std::size_t length(const std::string& s) {
        return static_cast<std::size_t>(
            std::count_if(s.begin(), s.end(), [](char ch) { return (ch & 0xC0) != 0x80; }));
    }
    std::vector<Align> aligns_;
    std::string indent_;
    std::vector<std::vector<std::string>> rows_;
};

}  // namespace memcalc::cli
