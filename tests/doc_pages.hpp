#pragma once
// The pages whose examples the suite runs: README.md, then docs/*.md in name order.
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace testing {

struct DocPage {
    std::string name;  ///< relative to the source directory: "README.md", "docs/serving.md"
    std::string text;
};

inline std::vector<DocPage> doc_pages() {
    const std::filesystem::path root = MEMCALC_SOURCE_DIR;
    std::vector<std::string> names{"README.md"};
    std::vector<std::string> docs;
    for (const auto& entry : std::filesystem::directory_iterator(root / "docs"))
        if (entry.is_regular_file() && entry.path().extension() == ".md")
            docs.push_back("docs/" + entry.path().filename().string());
    std::sort(docs.begin(), docs.end());
    names.insert(names.end(), docs.begin(), docs.end());
    std::vector<DocPage> pages;
    for (const auto& name : names) {
        std::ifstream file(root / name, std::ios::binary);
        std::ostringstream text;
        text << file.rdbuf();
        pages.push_back({name, text.str()});
    }
    return pages;
}

}  // namespace testing
