// clawfleet console: live fragments over server-sent events, and the log follow button.
// Every fragment is HTML the coordinator rendered (and escaped); this script never builds
// markup from data. Without it the pages still show what was true when they were served.
(function () {
  "use strict";
  var MAX_LINES = 2000;

  function split(data) {
    var i = data.indexOf("\n");
    return i < 0 ? null : { id: data.slice(0, i), html: data.slice(i + 1) };
  }

  function status(el, text, lost) {
    var s = document.getElementById(el.getAttribute("data-sse-status") || "");
    if (s) { s.textContent = text; }
    el.classList.toggle("stale", lost);
  }

  function listen(el, url) {
    var src = new EventSource(url);
    src.addEventListener("open", function () { status(el, "live", false); });
    src.addEventListener("error", function () {
      status(el, "live updates lost: what is shown may be out of date (retrying)", true);
    });
    src.addEventListener("replace", function (e) {
      var f = split(e.data);
      var t = f && document.getElementById(f.id);
      if (t) { t.innerHTML = f.html; }
    });
    src.addEventListener("append", function (e) {
      var f = split(e.data);
      var t = f && document.getElementById(f.id);
      if (!t) { return; }
      var atEnd = t.scrollTop + t.clientHeight >= t.scrollHeight - 4;
      t.insertAdjacentHTML("beforeend", f.html);
      while (t.children.length > MAX_LINES) { t.removeChild(t.firstElementChild); }
      if (atEnd) { t.scrollTop = t.scrollHeight; }
    });
    src.addEventListener("end", function () { src.close(); status(el, "stream ended", false); });
    return src;
  }

  document.addEventListener("DOMContentLoaded", function () {
    document.querySelectorAll("[data-sse]").forEach(function (el) {
      listen(el, el.getAttribute("data-sse"));
    });
    document.querySelectorAll("button[data-follow]").forEach(function (b) {
      var src = null;
      var target = document.getElementById(b.getAttribute("aria-controls"));
      b.hidden = false;
      b.addEventListener("click", function () {
        if (src) {
          src.close(); src = null;
          b.setAttribute("aria-pressed", "false");
          b.textContent = "Follow log";
          status(target, "not following", false);
        } else {
          src = listen(target, b.getAttribute("data-follow"));
          b.setAttribute("aria-pressed", "true");
          b.textContent = "Stop following";
        }
      });
    });
  });
})();
