#pragma once
// "Did you mean": the nearest known name to a mistyped one, by edit distance.
#include <algorithm>
#include <string>
#include <vector>

namespace memcalc::cli {

inline std::size_t edit_distance(const std::string& a, const std::string& b) {
    std::vector<std::size_t> row(b.size() + 1);
    for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
    for (std::size_t i = 1; i <= a.size(); ++i) {
        std::size_t diagonal = row[0];
        row[0] = i;
        for (std::size_t j = 1; j <= b.size(); ++j) {
            const std::size_t above = row[j];
            row[j] =
                std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
            diagonal = above;
        }
    }
    return row[b.size()];
}

/// " (did you mean 'x'?)" when a candidate is close enough to be a likely typo, else "".
inline std::string did_you_mean(const std::string& wrong,
                                const std::vector<std::string>& candidates) {
    // The one name that begins with what was typed ("h100" for "h100-sxm") beats a near miss
    // ("h200").
    const auto begins = [&](const std::string& c) {
        return wrong.size() >= 3 && c.rfind(wrong, 0) == 0;
    };
    const auto beginning = std::count_if(candidates.begin(), candidates.end(), begins);
    if (beginning == 1)
        return " (did you mean '" + *std::find_if(candidates.begin(), candidates.end(), begins) +
               "'?)";
    if (beginning <= 3 && beginning > 1) {  // a few ("h100" for the H100s): each of them
        std::vector<std::string> names;
        for (const auto& c : candidates)
            if (begins(c)) names.push_back("'" + c + "'");
        std::string text = names[0];
        for (std::size_t i = 1; i < names.size(); ++i)
            text += (i + 1 == names.size() ? " or " : ", ") + names[i];
        return " (did you mean " + text + "?)";
    }
    const std::string* best = nullptr;
    std::size_t best_distance = 0;
    for (const auto& c : candidates) {
        const std::size_t d = edit_distance(wrong, c);
        if (best == nullptr || d < best_distance) best = &c, best_distance = d;
    }
    if (best == nullptr) return "";
    if (best_distance > std::max<std::size_t>(2, wrong.size() / 3)) {
        // Not a typo, but perhaps a part of the name ("adam" for "mixed-adam").
        const auto part =
            std::find_if(candidates.begin(), candidates.end(), [&](const std::string& c) {
                return wrong.size() >= 3 && c.find(wrong) != std::string::npos;
            });
        if (part == candidates.end()) return "";
        best = &*part;
    }
    return " (did you mean '" + *best + "'?)";
}

}  // namespace memcalc::cli
