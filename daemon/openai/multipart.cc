#include "daemon/openai/multipart.h"

#include <algorithm>
#include <cctype>

namespace offloadd::daemon::openai {
namespace {

std::string Lower(std::string_view s) {
  std::string out(s);
  std::transform(out.begin(), out.end(), out.begin(),
                 [](unsigned char c) { return std::tolower(c); });
  return out;
}

std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

// The value of `key` among "; key=value" parameters (quoted or not); "" when absent.
std::string Parameter(std::string_view header, std::string_view key) {
  size_t pos = 0;
  while ((pos = header.find(';', pos)) != std::string_view::npos) {
    std::string_view rest = Trim(header.substr(pos + 1));
    const size_t eq = rest.find('=');
    pos += 1;
    if (eq == std::string_view::npos) continue;
    if (Lower(Trim(rest.substr(0, eq))) != key) continue;
    std::string_view value = Trim(rest.substr(eq + 1));
    if (!value.empty() && value.front() == '"') {
      std::string out;
      for (size_t i = 1; i < value.size() && value[i] != '"'; ++i) {
        if (value[i] == '\\' && i + 1 < value.size()) ++i;
        out += value[i];
      }
      return out;
    }
    return std::string(value.substr(0, value.find(';')));
  }
  return "";
}

}  // namespace

StatusOr<std::string> MultipartBoundary(const std::string& content_type) {
  const std::string_view type =
      Trim(std::string_view(content_type).substr(0, content_type.find(';')));
  if (Lower(type) != "multipart/form-data") {
    return InvalidArgumentError("expected Content-Type multipart/form-data, got '" +
                                std::string(type) + "'");
  }
  std::string boundary = Parameter(content_type, "boundary");
  if (boundary.empty() || boundary.size() > 70) {
    return InvalidArgumentError(
        "Content-Type multipart/form-data needs a boundary of 1 to 70 characters");
  }
  return boundary;
}

StatusOr<std::vector<FormPart>> ParseMultipart(std::string_view body, const std::string& boundary) {
  const std::string delimiter = "--" + boundary;
  std::vector<FormPart> parts;
  size_t pos = body.find(delimiter);
  if (pos == std::string_view::npos)
    return InvalidArgumentError("multipart body has no boundary line");
  for (;;) {
    pos += delimiter.size();
    if (body.substr(pos, 2) == "--") return parts;  // the closing delimiter
    if (body.substr(pos, 2) != "\r\n") {
      return InvalidArgumentError("multipart boundary line not followed by CRLF");
    }
    pos += 2;
    const size_t header_end = body.find("\r\n\r\n", pos);
    if (header_end == std::string_view::npos)
      return InvalidArgumentError("multipart part without a header end");
    FormPart part;
    std::string_view headers = body.substr(pos, header_end - pos);
    while (!headers.empty()) {
      const size_t eol = headers.find("\r\n");
      const std::string_view line = headers.substr(0, eol);
      headers = eol == std::string_view::npos ? std::string_view() : headers.substr(eol + 2);
      const size_t colon = line.find(':');
      if (colon == std::string_view::npos)
        return InvalidArgumentError("multipart header line without ':'");
      const std::string name = Lower(Trim(line.substr(0, colon)));
      const std::string_view value = Trim(line.substr(colon + 1));
      if (name == "content-disposition") {
        if (Lower(Trim(value.substr(0, value.find(';')))) != "form-data") {
          return InvalidArgumentError("multipart part's Content-Disposition is not form-data");
        }
        part.name = Parameter(value, "name");
        part.filename = Parameter(value, "filename");
      } else if (name == "content-type") {
        part.content_type = std::string(value);
      }
    }
    if (part.name.empty()) return InvalidArgumentError("multipart part without a name");
    const size_t start = header_end + 4;
    const size_t end = body.find("\r\n" + delimiter, start);
    if (end == std::string_view::npos) {
      return InvalidArgumentError("multipart part '" + part.name +
                                  "' is not closed by the boundary");
    }
    part.body = body.substr(start, end - start);
    parts.push_back(std::move(part));
    pos = end + 2;
  }
}

}  // namespace offloadd::daemon::openai
