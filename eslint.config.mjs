// ESLint flat config for the TypeScript of ts/, __test__/ and bench/ (`npm run lint`).
// Recommended rules of ESLint and typescript-eslint (syntax-only: no type-aware rules, so a lint
// run costs seconds); the few rules turned off say why.
import js from '@eslint/js';
import tseslint from 'typescript-eslint';

export default tseslint.config(
  { ignores: ['dist/', 'binding/', 'target/', 'node_modules/', 'bench/work/', 'crates/'] },
  js.configs.recommended,
  ...tseslint.configs.recommended,
  {
    files: ['ts/**/*.ts', '__test__/**/*.ts', 'bench/**/*.ts'],
    languageOptions: { ecmaVersion: 2022, sourceType: 'module' },
    linterOptions: { reportUnusedDisableDirectives: 'error' },
  },
  {
    // Tests read untyped NDJSON events and poke at protocol internals; tsc's strict mode still checks the rest.
    files: ['__test__/**/*.ts'],
    rules: { '@typescript-eslint/no-explicit-any': 'off' },
  },
);
