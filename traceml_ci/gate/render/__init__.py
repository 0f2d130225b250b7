"""What a comparison looks like to a person: the lead lines (``lead``), the terminal, markdown
and JSON reports (``comparison``), the ranks' table (``ranks``), mermaid charts (``chart``), the
HTML report (``html``) and a profiled run's top ops (``ops``). Pure: results in, text out."""
