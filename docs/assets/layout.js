// Tables on narrow screens: a table of more than three columns, or one still wider than its
// column once its cells wrap, is shown as cards (one block per row, each cell labelled with its
// column's header; the CSS is in extra.css). Runs on load and when the window is resized.
(function () {
  "use strict";
  var NARROW = 700;   // px of window width below which wide tables become cards

  function label(table) {
    var heads = Array.prototype.map.call(table.querySelectorAll("thead th"), function (th) {
      return th.textContent.trim();
    });
    Array.prototype.forEach.call(table.querySelectorAll("tbody tr"), function (tr) {
      Array.prototype.forEach.call(tr.children, function (td, k) {
        if (heads[k]) td.setAttribute("data-label", heads[k]);
      });
    });
  }

  function columns(table) {
    var row = table.querySelector("tr");
    return row ? row.children.length : 0;
  }

  function layout() {
    var narrow = window.innerWidth < NARROW;
    Array.prototype.forEach.call(document.querySelectorAll(".md-typeset table"), function (table) {
      var cards = table.classList.contains("minipos-cards");
      if (!cards && table.className && !table.dataset.miniposTable) return;   // tables with a class of their own
      table.dataset.miniposTable = "1";
      if (!narrow) {
        if (cards) table.classList.remove("minipos-cards");
        return;
      }
      if (cards) return;
      var box = table.parentElement;
      if (columns(table) > 3 || table.scrollWidth > box.clientWidth + 1) {
        label(table);
        table.classList.add("minipos-cards");
      }
    });
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", layout);
  else layout();
  window.addEventListener("resize", layout);
})();
