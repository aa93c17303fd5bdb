// evolver studio: refresh the live part of a run page without a reload (plain polling, no library).
(function () {
  "use strict";
  function poll() {
    var box = document.getElementById("live");
    if (!box || box.dataset.status !== "live") { return; }
    var every = parseFloat(box.dataset.refresh || "5") * 1000;
    setTimeout(function () {
      fetch(box.dataset.src, { credentials: "same-origin", cache: "no-store" })
        .then(function (r) { return r.ok ? r.text() : Promise.reject(r.status); })
        .then(function (html) {
          var holder = document.createElement("div");
          holder.innerHTML = html;
          var fresh = holder.querySelector("#live");
          if (fresh) { box.replaceWith(fresh); }
        })
        .catch(function () { /* a busy studio: try again next turn */ })
        .then(poll);
    }, every);
  }
  poll();
}());
