// qlflow dashboard: local times, relative hints, the time zone for the filters, and
// the live refresh of a running Run's page (polls a fragment once a second).
(function () {
  "use strict";

  function pad(n, width) {
    return String(n).padStart(width || 2, "0");
  }

  function localText(ms) {
    var d = new Date(ms);
    return d.getFullYear() + "-" + pad(d.getMonth() + 1) + "-" + pad(d.getDate()) + " " +
      pad(d.getHours()) + ":" + pad(d.getMinutes()) + ":" + pad(d.getSeconds()) + "." +
      pad(d.getMilliseconds(), 3);
  }

  function duration(ms) {
    if (ms < 1000) return ms + "ms";
    if (ms < 60000) return (ms / 1000).toFixed(1) + "s";
    var s = Math.floor(ms / 1000), m = Math.floor(s / 60);
    if (m < 60) return m + "m" + pad(s % 60) + "s";
    var h = Math.floor(m / 60);
    if (h < 48) return h + "h" + pad(m % 60) + "m";
    return Math.floor(h / 24) + "d" + pad(h % 24) + "h";
  }

  function relative(ms) {
    var delta = Date.now() - ms;
    if (Math.abs(delta) < 1000) return "just now";
    return delta > 0 ? duration(delta) + " ago" : "in " + duration(-delta);
  }

  function decorate(root) {
    root.querySelectorAll("time.local[data-ms]").forEach(function (el) {
      var ms = Number(el.dataset.ms);
      el.textContent = localText(ms);
      el.title = new Date(ms).toString();
    });
    refreshRelative(root);
  }

  function refreshRelative(root) {
    root.querySelectorAll(".rel[data-ms]").forEach(function (el) {
      el.textContent = relative(Number(el.dataset.ms));
    });
  }

  function live(el) {
    var busy = false;
    function tick() {
      if (busy || el.dataset.live !== "1") return;
      busy = true;
      var url = el.dataset.liveUrl + "?stamp=" + encodeURIComponent(el.dataset.stamp || "");
      fetch(url, { credentials: "same-origin", headers: { Accept: "text/html" }, cache: "no-store" })
        .then(function (response) {
          if (response.status !== 200) return null;
          el.dataset.stamp = response.headers.get("X-Qlflow-Stamp") || "";
          el.dataset.live = response.headers.get("X-Qlflow-Live") || "0";
          return response.text();
        })
        .then(function (html) {
          if (html === null) return;
          el.innerHTML = html; // rendered and escaped by the server
          decorate(el);
          el.dispatchEvent(new CustomEvent("qlflow:updated", { bubbles: true }));
        })
        .catch(function () { /* the next tick tries again */ })
        .finally(function () { busy = false; });
    }
    setInterval(tick, 1000);
  }

  document.addEventListener("DOMContentLoaded", function () {
    decorate(document);
    setInterval(function () { refreshRelative(document); }, 5000);
    document.querySelectorAll("input[data-tz]").forEach(function (input) {
      input.value = String(new Date().getTimezoneOffset());
    });
    document.querySelectorAll("[data-live-url]").forEach(live);
  });
})();
